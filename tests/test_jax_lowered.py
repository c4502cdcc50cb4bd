"""JAX steps as users hand them over: `lowered.as_text()` without XLA's header flags, and verify on a step
with pinned and free outputs.

The grid's references are XLA's own compiles; each NAME.hlo is JAX's lowered text with XLA's header
line, so `lowered_form` gives back what the user pastes. The mixed-output step (AdamW returning params and
state pinned, gradients free) is compiled by XLA:CPU and XLA:TPU with one propagation flag per output.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from fidelity.cases import ACCUMULATION_CASES, CI_SUBSET, Case
from fidelity.lowered import lowered_form
from fidelity.mixed_outputs import NAME as MIXED
from fidelity.mixed_outputs import ensure_reference
from fidelity.placement_check import compiled_bytes
from fidelity.references import ensure_references, reference_path
from planner import parse_hlo
from planner.errors import PlanningError
from planner.hlo.compile_defaults import OUTPUT_FLAGS, output_flags_from_root
from planner.memory import memory_report
from planner.plan.planner import make_plan
from planner.plan.verify import compile_with_xla, output_propagation
from planner.prepare import prepare
from planner.propagation import propagate

JAX_CASES = [c for c in CI_SUBSET if c.front_end == "jax"] + [c for c in ACCUMULATION_CASES if c.step == "toy"]


@pytest.fixture(scope="module")
def references() -> None:
    assert ensure_references(JAX_CASES, jobs=2) == []


def _both_forms(case: Case) -> tuple[str, str]:
    text = reference_path(case).read_text()
    return text, lowered_form(text)


@pytest.mark.parametrize("case", JAX_CASES, ids=[c.name for c in JAX_CASES])
def test_the_lowered_text_propagates_and_sizes_as_xla_s_dump(references: None, case: Case) -> None:
    dump, lowered = _both_forms(case)
    assert OUTPUT_FLAGS in dump.partition("\n")[0] and OUTPUT_FLAGS not in lowered.partition("\n")[0]
    for backend in ("cpu", case.chip):
        given, pasted = prepare(parse_hlo(dump), backend), prepare(parse_hlo(lowered), backend)
        # The defaults JAX compiles with are the flags XLA's dump shows, output by output.
        assert pasted.options == given.options
        assert pasted.source.attr("num_partitions") == given.source.attr("num_partitions") == case.mesh.num_devices
        assert any(OUTPUT_FLAGS in w for w in pasted.warnings) and not any(OUTPUT_FLAGS in w for w in given.warnings)
        ours, theirs = propagate(given), propagate(pasted)
        assert {i.name: i.sharding for i in ours.instructions} == {i.name: i.sharding for i in theirs.instructions}
        assert memory_report(pasted, result=theirs).total_bytes == memory_report(given, result=ours).total_bytes


@pytest.mark.parametrize("case", [JAX_CASES[0], ACCUMULATION_CASES[0]], ids=lambda c: c.name)
def test_the_plan_from_lowered_text_is_the_plan_from_the_dump(references: None, case: Case) -> None:
    dump, lowered = _both_forms(case)
    given, _ = make_plan(prepare(parse_hlo(dump), case.chip))
    pasted, _ = make_plan(prepare(parse_hlo(lowered), case.chip))
    assert pasted.model_dump(exclude={"warnings"}) == given.model_dump(exclude={"warnings"})
    assert pasted.warnings[0].startswith(f"the header has no {OUTPUT_FLAGS} (JAX's lowered text")


@pytest.fixture(scope="module")
def mixed() -> dict[str, Any]:
    out = ensure_reference()
    return {
        "dump": (out / f"{MIXED}.hlo").read_text(),
        "lowered": (out / f"{MIXED}.lowered.hlo").read_text(),
        "record": json.loads((out / f"{MIXED}.xla.json").read_text()),
    }


def test_mixed_outputs_are_read_output_by_output(mixed: dict[str, Any]) -> None:
    flags = parse_hlo(mixed["dump"]).attr(OUTPUT_FLAGS)
    assert True in flags and False in flags  # params and state pinned, gradients free
    lowered = parse_hlo(mixed["lowered"])
    read = output_flags_from_root(lowered)
    # The lowered text writes {replicated} both for a free output and for one pinned to P(): a free
    # gradient of a sharded weight is told apart by its shape; a replicated norm's free gradient is not,
    # and the plan says which outputs it read as pinned.
    root = lowered.entry.root
    differ = [i for i, (x, y) in enumerate(zip(flags, read)) if x != y]
    assert differ and all(flags[i] and root.sharding.elements[i].is_replicated for i in differ)
    sharded_free = [i for i, f in enumerate(flags) if f and i not in differ]
    assert len(sharded_free) == 9 and all(read[i] for i in sharded_free)
    warning = prepare(lowered).warnings[0]
    assert "which JAX writes both for an unspecified output and for one pinned to P()" in warning


@pytest.mark.parametrize("backend", ["cpu", "v6e"])
def test_verify_compiles_mixed_outputs_with_a_flag_per_output(mixed: dict[str, Any], backend: str) -> None:
    module = parse_hlo(mixed["dump"])
    flags = output_propagation(module)
    assert isinstance(flags, tuple) and len(flags) == len(module.entry.root.operands)
    plan, _ = make_plan(prepare(module, backend), verify=True)
    checked = plan.verification
    assert plan.verification_skipped is None and checked is not None
    # Its numbers are the sweep's (the same text compiled with the same flags), and JAX's own compile of
    # the step: the free outputs reach XLA without the {replicated} the text writes for them.
    record = mixed["record"]
    assert checked.given_total_bytes == compiled_bytes(mixed["dump"], 8, flags, None) == record["cpu"]["total_bytes"]
    if backend != "cpu":
        assert checked.tpu is not None
        topology = checked.tpu.topology
        assert checked.tpu.given_total_bytes == compiled_bytes(mixed["dump"], 8, flags, topology)
        assert checked.tpu.given_total_bytes == record["tpu"]["total_bytes"]


def test_one_flag_for_every_output_cannot_compile_a_donating_step(mixed: dict[str, Any]) -> None:
    """Why the flags stay per output: letting XLA shard every output reshards a donated one away from
    the size of the input it aliases, and XLA refuses the module."""
    with pytest.raises(PlanningError, match="aliased input"):
        compile_with_xla(mixed["dump"], 8, True)
