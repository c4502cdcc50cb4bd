"""JAX steps as users hand them over: `lowered.as_text(dialect="hlo")` without XLA's header flags,
`lowered.as_text()` (StableHLO text), and verify on a step with pinned and free outputs.

The grid's references are XLA's own compiles; each NAME.hlo is JAX's lowered text with XLA's header
line, so `lowered_form` gives back what the user pastes as HLO; `fidelity.stablehlo_forms` lowers the same
step again and keeps the StableHLO text. The mixed-output step (AdamW returning params and state pinned,
gradients free) is compiled by XLA:CPU and XLA:TPU with one propagation flag per output.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from fidelity.cases import ACCUMULATION_CASES, CI_SUBSET, Case
from fidelity.lowered import lowered_form
from fidelity.mixed_outputs import NAME as MIXED
from fidelity.mixed_outputs import ensure_reference
from fidelity.placement_check import compiled
from fidelity.references import ensure_references, reference_path
from fidelity.stablehlo_forms import ensure_stablehlo_forms, stablehlo_path
from planner import parse_hlo
from planner.errors import PlanningError
from planner.hlo.text.compile_defaults import OUTPUT_FLAGS, output_flags_from_root
from planner.hlo.text.stablehlo_text import read_stablehlo
from planner.memory import memory_report
from planner.plan.compilers.verify import compile_with_xla, output_propagation
from planner.plan.planner import make_plan
from planner.prepare import prepare
from planner.propagation import propagate

JAX_CASES = [c for c in CI_SUBSET if c.front_end == "jax"] + [c for c in ACCUMULATION_CASES if c.step == "toy"]


@pytest.fixture(scope="module")
def references() -> None:
    assert ensure_references(JAX_CASES, jobs=2) == []
    ensure_stablehlo_forms(JAX_CASES)


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


@pytest.mark.parametrize("case", JAX_CASES, ids=[c.name for c in JAX_CASES])
def test_stablehlo_text_propagates_and_sizes_as_xla_s_dump(references: None, case: Case) -> None:
    dump = parse_hlo(reference_path(case).read_text())
    pasted_module = parse_hlo(stablehlo_path(case).read_text())
    # The flags JAX compiles with, read from the results' and arguments' sharding attributes, are the
    # dump's exactly: no defaults assumed, nothing to warn of.
    for key in (OUTPUT_FLAGS, "allow_spmd_sharding_propagation_to_parameters", "num_partitions"):
        assert pasted_module.attr(key) == dump.attr(key), key
    for backend in ("cpu", case.chip):
        given, pasted = prepare(dump, backend), prepare(pasted_module, backend)
        assert pasted.options == given.options and pasted.warnings == given.warnings
        ours, theirs = propagate(given), propagate(pasted)
        # The same instructions in the same order under generic names: as_text() prints no locations.
        assert [(i.opcode, i.sharding) for i in theirs.instructions] == [
            (i.opcode, i.sharding) for i in ours.instructions
        ]
        assert memory_report(pasted, result=theirs).total_bytes == memory_report(given, result=ours).total_bytes


def _unnamed(value: Any) -> Any:
    """A plan with instruction names reduced to their ids. StableHLO text without locations names
    `dot_general.460` `dot.460`; a timeline's positions also name the instructions XLA:TPU's simplification
    passes add, numbered per name, so only their count is kept."""
    if isinstance(value, dict):
        return {k: len(v) if k == "positions" else _unnamed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unnamed(v) for v in value]
    if isinstance(value, str):
        return re.sub(r"[A-Za-z_][\w\-]*\.(\d+)\b", r"#\1", value)
    return value


@pytest.mark.parametrize("case", [JAX_CASES[0], ACCUMULATION_CASES[0]], ids=lambda c: c.name)
def test_the_plan_from_stablehlo_text_is_the_plan_from_the_dump(references: None, case: Case) -> None:
    # `as_text()` keeps no source lines, which is what names parameters and buffers in a plan: the dump is
    # read without its metadata (`as_text(debug_info=True)` keeps them in both forms).
    dump = re.sub(r", metadata=\{[^}]*\}", "", reference_path(case).read_text())
    given, _ = make_plan(prepare(parse_hlo(dump), case.chip))
    pasted, _ = make_plan(prepare(parse_hlo(stablehlo_path(case).read_text()), case.chip))
    assert pasted.hbm.total_before == given.hbm.total_before and pasted.findings and pasted.placements
    assert _unnamed(pasted.model_dump()) == _unnamed(given.model_dump())


@pytest.fixture(scope="module")
def mixed() -> dict[str, Any]:
    out = ensure_reference()
    return {
        "dump": (out / f"{MIXED}.hlo").read_text(),
        "lowered": (out / f"{MIXED}.lowered.hlo").read_text(),
        "stablehlo": (out / f"{MIXED}.stablehlo.mlir").read_text(),
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


def test_stablehlo_text_tells_free_outputs_from_pinned_ones(mixed: dict[str, Any]) -> None:
    """Where the HLO text writes {replicated} for both, StableHLO writes no sharding on a free result: the
    flags are the dump's, the replicated norms' free gradients included."""
    dump, pasted = parse_hlo(mixed["dump"]), parse_hlo(mixed["stablehlo"])
    flags = dump.attr(OUTPUT_FLAGS)
    assert pasted.attr(OUTPUT_FLAGS) == flags and output_flags_from_root(parse_hlo(mixed["lowered"])) != flags
    assert not prepare(pasted).warnings


# Each form once, each compiler once: the two forms' flags are equal (the test above), and the v6e plan's
# verification compiles for XLA:CPU as well as XLA:TPU.
@pytest.mark.parametrize(("backend", "form"), [("cpu", "stablehlo"), ("v6e", "dump")])
def test_verify_compiles_mixed_outputs_with_a_flag_per_output(mixed: dict[str, Any], backend: str, form: str) -> None:
    # The text verify compiles: XLA's dump, or the HLO module StableHLO text converts to.
    text = mixed["dump"] if form == "dump" else read_stablehlo(mixed["stablehlo"])
    module = parse_hlo(text)
    flags = output_propagation(module)
    assert isinstance(flags, tuple) and len(flags) == len(module.entry.root.operands)
    plan, _ = make_plan(prepare(module, backend), verify=True)
    checked = plan.verification
    assert plan.verification_skipped is None and checked is not None
    # Its numbers are the sweep's (the same text compiled with the same flags), and JAX's own compile of
    # the step: the free outputs reach XLA without the {replicated} the text writes for them.
    record = mixed["record"]
    assert checked.given_total_bytes == compiled(text, 8, flags, None).total_bytes == record["cpu"]["total_bytes"]
    if backend != "cpu":
        assert checked.tpu is not None
        topology = checked.tpu.topology
        assert checked.tpu.given_total_bytes == compiled(text, 8, flags, topology).total_bytes
        # On XLA:TPU both are its HBM per chip (its buffer assignment in memory space 0).
        assert checked.tpu.given_total_bytes == record["tpu"]["hbm_bytes"]


def test_one_flag_for_every_output_cannot_compile_a_donating_step(mixed: dict[str, Any]) -> None:
    """Why the flags stay per output: letting XLA shard every output reshards a donated one away from
    the size of the input it aliases, and XLA refuses the module."""
    with pytest.raises(PlanningError, match="aliased input"):
        compile_with_xla(mixed["dump"], 8, True)
