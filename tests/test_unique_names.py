"""Instruction names repeated across computations are renamed as XLA's parser renames them."""

from __future__ import annotations

from pathlib import Path

import pytest

from planner import parse_hlo
from planner.hlo.ir.unique_names import uniquify_instruction_names
from planner.memory import memory_report
from planner.prepare import prepare
from planner.propagation import propagate

FIXTURE = Path(__file__).parent / "fixtures" / "repeated_names.hlo"


def _names_by_computation(module) -> dict[str, set[str]]:  # type: ignore[no-untyped-def]
    return {c.name: {i.name for i in c.instructions} for c in module.computations}


def test_the_names_are_xla_s() -> None:
    xla = pytest.importorskip("jax._src.lib")._jax.hlo_module_from_text(FIXTURE.read_text())
    ours = parse_hlo(FIXTURE.read_text())
    # XLA's module prints with its unique names, which read back verbatim.
    assert _names_by_computation(ours) == _names_by_computation(parse_hlo(xla.to_string()))
    assert ours.entry.root.name == "result.2" and ours.computation("cond").root.name == "result.1"


def test_a_module_with_repeated_names_is_sized_and_propagated() -> None:
    prepared = prepare(parse_hlo(FIXTURE.read_text()), "v6e")
    result = propagate(prepared)
    # The body's result is the loop's f32 element, 8 ways split; the condition's is a pred[].
    by_name = {i.name: i for i in result.instructions}
    assert str(by_name["result"].sharding) == "{devices=[8,1]<=[8]}"
    assert str(by_name["w"].sharding) == "{{replicated}, {devices=[8,1]<=[8]}}"
    assert memory_report(prepared, result=result).total_bytes > 0


def test_control_predecessors_follow_the_renaming() -> None:
    text = (
        "HloModule m\n\nc {\n  a = f32[4] parameter(0)\n  b = f32[4] negate(a)\n  ROOT r = f32[4] abs(a), "
        "control-predecessors={b}\n}\n\nENTRY e {\n  a = f32[4] parameter(0)\n  b = f32[4] negate(a)\n"
        "  ROOT r = f32[4] call(b), to_apply=c, control-predecessors={a}\n}\n"
    )
    module = parse_hlo(text)
    assert module.entry.root.attr("control-predecessors").text == "{a.1}"
    assert module.computation("c").root.attr("control-predecessors").text == "{b}"
    assert module.entry.root.operands == ("b.1",)


def test_names_already_unique_are_left_alone() -> None:
    module = parse_hlo(FIXTURE.read_text())
    assert uniquify_instruction_names(module.computations) == module.computations
