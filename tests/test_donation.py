"""Donated buffers: outputs XLA writes into a parameter's buffer, from `input_output_alias` and `buffer_donor`.

torch_xla donates the parameters and optimizer state of a step it runs (`buffer_donor={ (1, {}), ... }`) and
leaves the pairing to XLA (`OptimizeInputOutputBufferAlias`: equal bytes, largest first). What a chip holds
outside the heap, arguments + outputs - aliased, is checked against XLA:CPU's own buffer assignment of
torch_xla's steps: its parameter, live-out and output-table allocations.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import CORPUS

from fidelity.cases import CI_SUBSET, Case
from fidelity.references import ensure_references, reference_path
from planner import parse_hlo, parse_hlo_file
from planner.memory import memory_report
from planner.memory.donation import buffer_donors, declared_aliases, outputs_in_parameter_buffers
from planner.prepare import prepare
from planner.propagation import propagate

# The docstring's worked example: donors p0 and p1 (4 KiB each) and p2 not donated (8 KiB); outputs a (4 KiB),
# b (8 KiB) and c, an s32 of a's bytes.
DONORS = """HloModule donors, buffer_donor={ (0, {}), (1, {}) }

ENTRY main {
  p0 = f32[1024]{0} parameter(0)
  p1 = f32[1024]{0} parameter(1)
  p2 = f32[2048]{0} parameter(2)
  a = f32[1024]{0} add(p0, p1)
  b = f32[2048]{0} add(p2, p2)
  c = s32[1024]{0} convert(a)
  ROOT t = (f32[1024]{0}, f32[2048]{0}, s32[1024]{0}) tuple(a, b, c)
}
"""


def _in_parameters(text: str) -> tuple[set[int], int]:
    prepared = prepare(parse_hlo(text), "cpu")
    result = propagate(prepared)
    return outputs_in_parameter_buffers(prepared.module, result), memory_report(prepared, result=result).alias_bytes


def test_donors_pair_with_outputs_of_equal_bytes_largest_first() -> None:
    assert buffer_donors(parse_hlo(DONORS)) == {(0, ()), (1, ())}
    # b has no donor of its bytes; a takes p0 and c, an s32 of the same bytes, takes p1.
    assert _in_parameters(DONORS) == ({0, 2}, 2 * 4096)


def test_a_donor_an_alias_already_uses_is_not_paired_again() -> None:
    text = DONORS.replace("HloModule donors,", "HloModule donors, input_output_alias={ {2}: (0, {}, may-alias) },")
    assert declared_aliases(parse_hlo(text)) == {(2,): (0, ())}
    # c is p0's outright; p1 is the one donor left and goes to a, the first output of its bytes.
    assert _in_parameters(text) == ({0, 2}, 2 * 4096)


def test_without_donors_nothing_is_paired() -> None:
    text = DONORS.replace(", buffer_donor={ (0, {}), (1, {}) }", "")
    assert _in_parameters(text) == (set(), 0)


TORCH_XLA_STEPS = [c for c in CI_SUBSET if c.front_end == "torch_xla"]


def _outside_the_heap(record: dict) -> int:
    """XLA:CPU's parameter, live-out and output-table allocations: arguments + outputs - aliased."""
    kinds = record["xla_allocation_bytes_by_kind"]
    return sum(kinds.get(k, 0) for k in ("parameter", "maybe-live-out", "output"))


def _ours(path: Path) -> int:
    prepared = prepare(parse_hlo_file(path), "cpu")
    report = memory_report(prepared, result=propagate(prepared))
    return report.argument_bytes + report.output_bytes - report.alias_bytes


@pytest.mark.xla
@pytest.mark.parametrize("case", TORCH_XLA_STEPS, ids=[c.name for c in TORCH_XLA_STEPS])
def test_a_torch_xla_steps_arguments_and_outputs_less_donated_equal_xla_cpus(case: Case) -> None:
    assert not ensure_references([case])
    path = reference_path(case)
    record = json.loads(path.with_suffix(".xla.json").read_text())
    xla = _outside_the_heap(record)
    if case.optimizer:
        assert buffer_donors(parse_hlo_file(path)), "torch_xla donates the parameters and moments AdamW updates"
    ours = _ours(path)
    assert abs(ours - xla) <= 0.05 * xla, (ours, xla)


def test_the_subset_has_a_torch_xla_step_that_donates() -> None:
    assert any(c.optimizer for c in TORCH_XLA_STEPS)


@pytest.mark.parametrize(
    "name", sorted(p.name.removesuffix(".truth.json") for p in (CORPUS / "torch_xla").glob("*.truth.json"))
)
def test_a_corpus_torch_xla_steps_arguments_and_outputs_equal_xla_cpus(name: str) -> None:
    record = json.loads((CORPUS / "torch_xla" / f"{name}.truth.json").read_text())
    xla = _outside_the_heap(record)
    ours = _ours(CORPUS / "torch_xla" / f"{name}.hlo")
    assert abs(ours - xla) <= 0.05 * xla, (ours, xla)
