"""XLA:CPU runs each computation in the order its memory scheduler finds leanest, not in program order."""

from __future__ import annotations

import json

import pytest
from conftest import corpus_hlo_files

from fidelity.cases import CI_SUBSET
from fidelity.references import ensure_references, reference_path
from fidelity.sweep import compiler_bytes
from planner import parse_hlo, parse_hlo_file
from planner.memory import estimate_memory
from planner.memory.model import _estimate_in_order
from planner.memory.schedule import list_schedule
from planner.memory.values import ValueModel, reads_leaf
from planner.prepare import prepare
from planner.propagation import propagate

# `big` (8 MiB) is written first but read last; `t0` (4 MiB) and its product `d0` (1 MiB) come and go between.
EARLY_BIG = """HloModule m

ENTRY e {
  p = f32[1024,1024] parameter(0)
  w = f32[1024,256] parameter(1)
  s = f32[1024,1024] sine(p)
  c = f32[1024,1024] cosine(p)
  big = f32[2048,1024] concatenate(s, c), dimensions={0}
  t0 = f32[1024,1024] exponential(p)
  d0 = f32[1024,256] dot(t0, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT out = f32[2048,256] dot(big, d0), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""


def test_the_list_schedule_makes_a_large_temporary_just_before_its_reader() -> None:
    prepared = prepare(parse_hlo(EARLY_BIG), "cpu")
    module = prepared.module
    result = propagate(prepared)
    model = ValueModel(module, result)
    model.build()
    order = [inst.name for inst in list_schedule(module.entry, model)]
    assert sorted(order) == sorted(inst.name for inst in module.entry.instructions)
    assert order.index("big") > order.index("d0") and order[-1] == "out"
    # Program order holds `big` through the small temporaries; the schedule XLA:CPU would pick does not.
    as_written = _estimate_in_order(module, result, None, "cpu")
    estimate = estimate_memory(prepared, result)
    # Program order: big, t0 and d0 at once (13 MiB); scheduled: t0 then d0, then big with d0 (9 MiB).
    assert (as_written.temp_bytes, estimate.temp_bytes) == (13 * 2**20, 9 * 2**20)
    assert estimate.scheduled is not None and estimate.scheduled.entry.instructions[-2].name == "big"
    # XLA:TPU schedules for latency: its estimate keeps the program order.
    tpu = prepare(parse_hlo(EARLY_BIG), "v6e")
    assert estimate_memory(tpu, propagate(tpu)).scheduled is None


# CI subset steps whose backward bodies write a large temporary long before its reader.
REORDERED = [c for c in CI_SUBSET if c.name in ("ci_jax_llama_dots_f32_gspmd_data2_fsdp2_tp2_L4_D1024_free",
                                               "ci_jax_llama_lmtied_onehot_V8192_adamwclip_f32master_noremat_bf16_gspmd_fsdp2_tp4_L4_D1024_pinned")]  # fmt: skip


@pytest.fixture(scope="module")
def references() -> None:
    assert ensure_references(REORDERED, jobs=2) == []


@pytest.mark.parametrize("case", REORDERED, ids=[c.name for c in REORDERED])
def test_the_scheduled_order_brings_the_prediction_to_xla_cpu_s(references: None, case) -> None:  # type: ignore[no-untyped-def]
    hlo = reference_path(case)
    xla = compiler_bytes(json.loads(hlo.with_suffix(".xla.json").read_text()), "cpu")
    prepared = prepare(parse_hlo_file(hlo), "cpu")
    result = propagate(prepared)
    as_written = _estimate_in_order(prepared.module, result, prepared.mesh, prepared.target).total_bytes
    scheduled = estimate_memory(prepared, result).total_bytes
    # Measured: +8.1% and +6.7% of XLA:CPU in program order, +5.2% and -6.3% in the order kept. (The
    # second step's loop body returns its residuals through a tuple whose elements are read one by one:
    # each dies at its own reader, as XLA's dataflow counts uses, so the schedule's body peak is lower
    # than XLA:CPU's by what the model does not yet hold there.)
    assert len(REORDERED) == 2
    assert (as_written - xla) / xla > 0.065
    assert abs(scheduled - xla) / xla < 0.065
    assert abs(scheduled - xla) < abs(as_written - xla)


def _scanned_schedule(comp, model: ValueModel) -> list[str]:  # type: ignore[no-untyped-def]
    """The list schedule's rule read literally: at every step, scan every ready instruction for the
    largest (bytes freed - bytes allocated, -program index); the root last."""
    index = {inst.name: k for k, inst in enumerate(comp.instructions)}
    leaves: dict[str, list] = {n: [] for n in index}
    size: dict = {}
    for v in model.size:
        if v[0] == comp.name:
            leaves[v[1]].append(v)
            size[model.uf.find(v)] = max(size.get(model.uf.find(v), 0), model.size[v])
    owner: dict = {}
    allocates = dict.fromkeys(index, 0)
    for inst in comp.instructions:
        for v in leaves[inst.name]:
            if v in model.allocating and model.uf.find(v) not in owner:
                owner[model.uf.find(v)] = inst.name
                allocates[inst.name] += model.size[v]
    # What an instruction reads, as XLA's dataflow counts uses: a get-tuple-element only its own element.
    reads = {n: {model.uf.find(v) for o in comp[n].operands for v in leaves[o] if reads_leaf(comp, comp[n], v[2])}
             for n in index}  # fmt: skip
    waiting = {g: {n for n in index if g in reads[n]} for g in size}
    done: set[str] = set()
    order: list[str] = []
    ready = [n for n in index if not comp[n].operands]
    while ready:
        choices = [n for n in ready if n != comp.root_name] or ready
        best = max(choices, key=lambda n: (sum(size[g] for g in reads[n] if waiting[g] == {n} and owner.get(g) in done)
                                           - allocates[n], -index[n]))  # fmt: skip
        ready.remove(best)
        done.add(best)
        order.append(best)
        for g in reads[best]:
            waiting[g].discard(best)
        ready += [u for u in comp.users(best) if all(o in done for o in comp[u].operands)]
    return order


@pytest.mark.parametrize("path", corpus_hlo_files(), ids=lambda p: p.stem)
def test_the_list_schedule_is_the_rule_read_literally_on_every_corpus_computation(path) -> None:  # type: ignore[no-untyped-def]
    """The scheduler keeps its candidates in a heap; it must pick, step by step, what a scan over every
    ready instruction picks, on every computation of every real step."""
    prepared = prepare(parse_hlo_file(path), "cpu")
    model = ValueModel(prepared.module, propagate(prepared))
    model.build()
    for comp in prepared.module.computations:
        assert [inst.name for inst in list_schedule(comp, model)] == _scanned_schedule(comp, model), comp.name
