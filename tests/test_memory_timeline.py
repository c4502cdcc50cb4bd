"""The memory timeline against the report it draws: the same model, so the same peak, to the byte.

The relation tested: the top of the entry's series is the report's total (arguments + outputs +
temporaries - aliased bytes, temporaries counted at the report's peak, less what on-chip memory
holds there), reached at the instruction where the report puts its peak; each loop body's
series tops out at the entry's value at its While.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import CORPUS

from planner import parse_hlo_file
from planner.data import DEFAULT_DUMP
from planner.memory import estimate_memory, memory_report, memory_timeline
from planner.memory.timeline import MAX_POINTS, subsample, timelines
from planner.mesh import Mesh
from planner.plan.planner import make_plan
from planner.prepare import prepare
from planner.propagation import propagate

GENERATED = Path(__file__).parent / "fixtures" / "generated"
CASES = [
    (DEFAULT_DUMP, "cpu"),
    (DEFAULT_DUMP, "v6e"),  # on-chip memory takes 96 MiB off the peak
    (CORPUS / "jax" / "jax_llama_scan_L8_fsdp4_tp2.hlo", "cpu"),
    (CORPUS / "jax" / "jax_llama_scan_L8_fsdp4_tp2.hlo", "v5p"),
    (CORPUS / "torch_xla" / "llama_loop_L4_fsdp4_tp2.hlo", "cpu"),  # no While: the entry alone
    (GENERATED / "jax_llama405b_remat_L126_fsdp64_tp4.hlo", "cpu"),  # 256 devices
]


@pytest.mark.parametrize(
    "path,backend", CASES, ids=[f"{p.parent.name}/{p.stem}-{b}" for p, b in CASES]
)  # fmt: skip
def test_entry_peak_is_the_report_s_total_at_the_report_s_peak(path: Path, backend: str) -> None:
    prepared = prepare(parse_hlo_file(path), backend)
    inlined = prepared.module
    result = propagate(prepared)
    report = memory_report(prepared, result=result)
    estimate = estimate_memory(prepared, result)
    series = memory_timeline(prepared, result)
    entry = series[0]
    assert entry.label == "entry" and entry.computation == inlined.entry_name
    assert max(entry.live_bytes) == entry.peak_bytes == report.total_bytes
    # Positions are in the order the estimate ran the entry in (XLA:CPU's scheduler may reorder it).
    scheduled = (estimate.scheduled or inlined).entry
    assert entry.positions[entry.peak_index] == scheduled.instructions[estimate.peak_position].name
    # Arguments and outputs are held the whole step: nothing dips below them.
    assert min(entry.live_bytes) >= report.argument_bytes + report.output_bytes - report.alias_bytes
    loops = [loop for loop in prepared.loops if loop.computation == inlined.entry_name]
    assert [s.label for s in series[1:]] == [f"body of {loop.name} ({loop.trip_count} trips)" for loop in loops]
    at = dict(zip(entry.positions, entry.live_bytes))
    for loop, body in zip(loops, series[1:]):
        assert body.computation == loop.body
        assert max(body.live_bytes) == body.peak_bytes == at[loop.name]
        length = len(inlined.computation(loop.body).instructions)
        assert len(body.positions) == length if length <= MAX_POINTS else len(body.positions) <= MAX_POINTS + 1


def test_plan_carries_timelines_before_and_after() -> None:
    plan, _ = make_plan(prepare(parse_hlo_file(DEFAULT_DUMP), mesh=Mesh.parse("fsdp=4,tp=2")))
    for series, total in ((plan.timeline_before, plan.hbm.total_before), (plan.timeline_after, plan.hbm.total_after)):
        assert [s.label for s in series] == ["entry", "body of while.953 (8 trips)", "body of while.2384 (8 trips)"]
        assert max(series[0].live_bytes) == total
        assert all(len(s.positions) == len(s.live_bytes) <= MAX_POINTS for s in series)
    # The after series is the patched module's: with the gradients pinned to their weights' shards the
    # forward body holds less at its peak (measured: 684.9 -> 539.2 MB).
    assert max(plan.timeline_after[1].live_bytes) < 0.9 * max(plan.timeline_before[1].live_bytes)


def test_timelines_read_the_estimate_they_are_given() -> None:
    prepared = prepare(parse_hlo_file(DEFAULT_DUMP))
    result = propagate(prepared)
    estimate = estimate_memory(prepared, result)
    assert timelines(prepared.module, result, estimate)[0].peak_bytes == estimate.total_bytes


@pytest.mark.parametrize("length,peak", [(50, 7), (4000, 0), (4000, 3999), (100_003, 51_234)])
def test_subsample_keeps_order_the_peak_and_each_stretch_s_extremes(length: int, peak: int) -> None:
    values = [(k * 7919) % 1000 for k in range(length)]
    values[peak] = 10_000
    keep = subsample(values, peak)
    assert keep == sorted(set(keep)) and peak in keep and len(keep) <= MAX_POINTS + 1
    if length <= MAX_POINTS:
        assert keep == list(range(length))
    else:
        # Every stretch's lowest value is kept: the line's dips survive the cut.
        assert min(values[k] for k in keep) == min(values)


def test_peak_of_spans_is_the_most_bytes_live_at_one_position() -> None:
    """The event sweep gives what summing every span (and the extra bytes) at every position gives, and
    the first position that holds the most, on random spans."""
    import random

    from planner.memory.model import peak_of_spans

    rng = random.Random(7)
    for _ in range(200):
        n = rng.randint(1, 40)
        spans = []
        for _ in range(rng.randint(0, 30)):
            start = rng.randrange(n)
            spans.append((start, rng.randrange(start, n), rng.randint(1, 1 << 20)))
        extra = {rng.randrange(n): rng.randint(1, 1 << 21) for _ in range(rng.randint(0, 3))}
        live = [sum(s for a, e, s in spans if a <= p <= e) + extra.get(p, 0) for p in range(n)]
        assert peak_of_spans(spans, n, extra) == (max(live), live.index(max(live)))
        assert peak_of_spans(spans, n)[0] == max(sum(s for a, e, s in spans if a <= p <= e) for p in range(n))
