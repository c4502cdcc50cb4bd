"""The worklist skips only visits that change nothing: shardings, provenance and plans are XLA's full sweep's.

`SPMD_PLANNER_WORKLIST=off` runs propagation as XLA writes it (every instruction not in the done
sets visited, the sets cleared at each level); `check` runs every inference the worklist would skip
and fails if one would have changed anything. Every corpus step, every generated fixture and every
case of XLA's own propagation tests goes through both, and every plan (its candidate placements
re-simulated) is compared whole.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import corpus_hlo_files, xla_cases

from fidelity.cases import CI_SUBSET, NEXT_STEP_CASES
from fidelity.references import ensure_references, reference_path
from planner import parse_hlo, parse_hlo_file
from planner.plan.planner import make_plan
from planner.prepare import prepare
from planner.propagation import PropagationOptions, PropagationResult, propagate
from planner.propagation.gspmd.driver import WORKLIST_VARIABLE

GENERATED = sorted((Path(__file__).parent / "fixtures" / "generated").glob("*.hlo"))
# References the suite generates (cached by content): the grid's CI subset and the 405B-shaped steps on 256 devices.
REFERENCES = [*CI_SUBSET, *NEXT_STEP_CASES]
STEPS = corpus_hlo_files() + GENERATED


@pytest.fixture(scope="module")
def references() -> dict[str, Path]:
    failed = ensure_references(REFERENCES, jobs=2)
    assert not failed, f"references not generated: {failed}"
    return {c.name: reference_path(c) for c in REFERENCES}


def _decisions(result: PropagationResult) -> list[tuple[object, ...]]:
    return [(i.name, i.computation, i.sharding, i.provenance, i.unknown_reason) for i in result.instructions]


def _propagated(
    monkeypatch: pytest.MonkeyPatch, mode: str, run: Callable[[], PropagationResult]
) -> list[tuple[object, ...]]:
    monkeypatch.setenv(WORKLIST_VARIABLE, mode)
    return _decisions(run())


@pytest.mark.parametrize("hlo", STEPS, ids=[p.name for p in STEPS])
def test_worklist_propagates_each_step_as_the_full_sweep(monkeypatch: pytest.MonkeyPatch, hlo: Path) -> None:
    prepared = prepare(parse_hlo_file(hlo))
    full = _propagated(monkeypatch, "off", lambda: propagate(prepared))
    assert _propagated(monkeypatch, "check", lambda: propagate(prepared)) == full
    assert _propagated(monkeypatch, "on", lambda: propagate(prepared)) == full


def test_worklist_propagates_xla_test_cases_as_the_full_sweep(monkeypatch: pytest.MonkeyPatch) -> None:
    cases = xla_cases()
    assert len(cases) >= 100
    for case in cases:
        module = parse_hlo(case["hlo"])
        options = PropagationOptions(
            case["is_spmd"], tuple(case["allow_to_output"]), tuple(case["allow_to_parameters"])
        )
        run = functools.partial(propagate, prepare(module, options=options, pass_input=True))
        full = _propagated(monkeypatch, "off", run)
        assert _propagated(monkeypatch, "check", run) == full, case["name"]


@pytest.mark.parametrize("hlo", STEPS, ids=[p.name for p in STEPS])
def test_every_plan_predicts_what_full_re_propagation_predicts(monkeypatch: pytest.MonkeyPatch, hlo: Path) -> None:
    module = parse_hlo_file(hlo)
    monkeypatch.setenv(WORKLIST_VARIABLE, "off")
    full, full_patched = make_plan(prepare(module))
    monkeypatch.setenv(WORKLIST_VARIABLE, "on")
    plan, patched = make_plan(prepare(module))
    assert plan.model_dump() == full.model_dump()
    assert patched == full_patched


@pytest.mark.xla
@pytest.mark.parametrize("name", [c.name for c in REFERENCES])
def test_generated_references_propagate_and_plan_as_the_full_sweep(
    monkeypatch: pytest.MonkeyPatch, references: dict[str, Path], name: str
) -> None:
    module = parse_hlo_file(references[name])
    prepared = prepare(module)
    full = _propagated(monkeypatch, "off", lambda: propagate(prepared))
    assert _propagated(monkeypatch, "check", lambda: propagate(prepared)) == full
    monkeypatch.setenv(WORKLIST_VARIABLE, "off")
    full_plan, _ = make_plan(prepare(module))
    monkeypatch.setenv(WORKLIST_VARIABLE, "on")
    plan, _ = make_plan(prepare(module))
    assert plan.model_dump() == full_plan.model_dump()


def test_an_unknown_worklist_mode_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(WORKLIST_VARIABLE, "sometimes")
    with pytest.raises(ValueError, match="SPMD_PLANNER_WORKLIST='sometimes': expected on, off or check"):
        propagate(prepare(parse_hlo_file(STEPS[0])))
