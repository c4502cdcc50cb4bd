"""XLA:TPU's all-reduce writes over its operand (XLA's `all-reduce-start` is an in-place op,
`HloDataflowAnalysis::GetInPlaceInputOutputPairs`; `Backend.all_reduces_in_place`) unless the operand is read
after it; XLA:CPU's writes a buffer of its own. On MaxText's Mixtral 8x7B (v6e-8) this is what leaves three 896 MiB expert gradients at XLA:TPU's peak,
not four."""

from __future__ import annotations

import json

import pytest
from conftest import REPO

from planner import parse_hlo, parse_hlo_file
from planner.memory.model import estimate_module
from planner.prepare import prepare
from planner.propagation import propagate

STEP = """HloModule m, num_partitions=8
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
ENTRY e {
  x = f32[4096,4096] parameter(0), sharding={replicated}
  w = f32[4096,4096] parameter(1), sharding={replicated}
  partial = f32[4096,4096] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={replicated}
  summed = f32[4096,4096] all-reduce(partial), replica_groups={}, to_apply=add, sharding={replicated}
  ROOT next = f32[4096,4096] dot(summed, LATER), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={replicated}
}
"""


def _buffers(text: str, chip: str) -> list[set[str]]:
    """The instructions whose values each buffer of the step holds."""
    prepared = prepare(parse_hlo(text), chip)
    estimate = estimate_module(prepared.module, propagate(prepared), prepared.mesh, prepared.target)
    return [{name for _, name, _ in buffer.values} for buffer in estimate.buffers]


def _shares(text: str, chip: str, a: str = "partial", b: str = "summed") -> bool:
    """Whether `a` and `b` are one buffer."""
    for names in _buffers(text, chip):
        if a in names:
            return b in names
    raise AssertionError(f"no buffer holds `{a}`")


@pytest.mark.parametrize(("chip", "in_place"), [("v6e", True), ("v5p", True), ("cpu", False)])
def test_an_all_reduce_writes_over_an_operand_nothing_reads_after_it(chip: str, in_place: bool) -> None:
    assert _shares(STEP.replace("LATER", "w"), chip) is in_place


def test_an_operand_read_after_the_all_reduce_keeps_its_own_buffer() -> None:
    assert not _shares(STEP.replace("LATER", "partial"), "v6e")


def test_an_operand_the_step_returns_keeps_its_own_buffer() -> None:
    returned = STEP.replace("LATER", "w").replace(
        "ROOT next = f32[4096,4096] dot(summed, w)", "next = f32[4096,4096] dot(summed, w)"
    )
    returned = (
        returned.rstrip().removesuffix("}") + "  ROOT out = (f32[4096,4096], f32[4096,4096]) tuple(next, partial)\n}\n"
    )
    assert not _shares(returned, "v6e")


def test_an_entry_parameter_is_not_written_over() -> None:
    reduced = STEP.replace("LATER", "w").replace("all-reduce(partial)", "all-reduce(x)")
    assert not _shares(reduced, "v6e", "x")


def test_a_result_returned_in_a_donated_parameter_keeps_the_operand_apart() -> None:
    donated = (
        STEP.replace(
            "HloModule m, num_partitions=8",
            "HloModule m, input_output_alias={ {}: (1, {}, may-alias) }, num_partitions=8",
        )
        .replace("LATER", "w")
        .replace(
            "ROOT next = f32[4096,4096] dot(summed, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={replicated}",
            "",
        )
        .replace("summed = f32[4096,4096] all-reduce", "ROOT summed = f32[4096,4096] all-reduce")
    )
    assert not _shares(donated, "v6e")


def test_chained_all_reduces_each_write_over_the_last() -> None:
    chained = (
        STEP.replace("LATER", "w")
        .replace(
            "  ROOT next",
            "  again = f32[4096,4096] all-reduce(summed), replica_groups={}, to_apply=add, sharding={replicated}\n  ROOT next",
        )
        .replace("dot(summed, w)", "dot(again, w)")
    )
    assert _shares(chained, "v6e", "partial", "again")


def test_mixtral_holds_three_expert_gradients_at_its_peak_as_xla_tpu_does() -> None:
    """MaxText's Mixtral 8x7B at 2 layers on v6e-8 (libtpu 0.0.52): XLA:TPU's heap holds three bf16[8,4096,14336]
    (896 MiB per device) at its fullest moment (the record's `live_peak_buffer_sizes`), the psums of the three
    expert weights' gradients, each written over the grouped matmul's result."""
    folder = REPO / "tests" / "fixtures" / "maxtext" / "libtpu_0_0_52"
    name = "maxtext_mixtral-8x7b_L2_v6e-8_shardy"
    record = json.loads((folder / f"{name}.xla.json").read_text())
    expert = 8 * 4096 * 14336 * 2
    xla = sum(size == expert for size in record["tpu"]["heap"]["live_peak_buffer_sizes"])
    prepared = prepare(parse_hlo_file(folder / f"{name}.hlo.gz"), "v6e", libtpu=record["libtpu"])
    estimate = estimate_module(prepared.module, propagate(prepared), prepared.mesh, prepared.target)
    ours = sum(b.size_bytes == expert for b in estimate.peak_temporaries)
    assert (ours, xla) == (3, 3)
