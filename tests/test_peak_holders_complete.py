"""What holds the peak, complete and right: on every step the corpus plans, the buffers holding the peak
(parameters, outputs, and the temporaries live there, inside While bodies too) add up to the reported
HBM per chip, each one's bytes are its per-device array's, and `memory --top` and the plan's peak
holders list the same ones."""

from __future__ import annotations

import json
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
from conftest import REPO, corpus_hlo_files

from planner import parse_hlo_file
from planner.data import DEFAULT_DUMP
from planner.memory import memory_report
from planner.memory.estimation import estimate_memory
from planner.memory.holders import Holder, holders_at_peak
from planner.memory.model import MemoryEstimate
from planner.mesh import Mesh
from planner.plan.diagnosis.peak_holders import holder_names, peak_holders
from planner.prepare import PreparedModule, prepare
from planner.propagation import PropagationResult, propagate

# The corpus steps `test_plans_everything` plans, and the 405B-shaped step on 256 devices.
LLAMA_405B = REPO / "tests" / "fixtures" / "generated" / "jax_llama405b_remat_L126_fsdp64_tp4.hlo"
STEPS = [*corpus_hlo_files(), LLAMA_405B]
# XLA:CPU, and a chip whose compiler keeps part of the peak in on-chip memory.
BACKENDS = ("cpu", "v6e")
TOLERANCE = 0.01


@cache
def _sized(path: Path, backend: str) -> tuple[PreparedModule, PropagationResult, MemoryEstimate]:
    prepared = prepare(parse_hlo_file(path), backend)
    result = propagate(prepared)
    return prepared, result, estimate_memory(prepared, result)


def _why_not_its_array(h: Holder) -> str | None:
    """None when the holder's bytes are its per-device array's, or a reason is given; else what is wrong."""
    held = h.buffer.held
    if h.per_device_bytes == held.byte_size or h.buffer.note:
        return None
    return f"{h.describe()}: {held.to_text(False)} is {held.byte_size:,} bytes, the holder {h.per_device_bytes:,}"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("path", STEPS, ids=[p.name.removesuffix(".hlo") for p in STEPS])
def test_the_holders_add_up_to_the_peak(path: Path, backend: str) -> None:
    prepared, _, estimate = _sized(path, backend)
    holders = holders_at_peak(prepared.module, estimate)
    total = estimate.total_bytes
    held = sum(h.per_device_bytes for h in holders) - estimate.on_chip_bytes + estimate.packing_bytes
    print(f"{path.name} {backend}: holders {held:,} of {total:,} bytes ({len(holders)} buffers)")
    assert abs(held - total) <= TOLERANCE * total, f"holders {held:,} bytes, the peak {total:,}"
    assert [why for h in holders if (why := _why_not_its_array(h))] == []
    # Every kind of holder the step has: its parameters and outputs whole, its temporaries at the peak.
    kinds = {h.buffer.category for h in holders}
    assert {"parameter", "output"} <= kinds
    assert sum(h.per_device_bytes for h in holders if h.buffer.category == "parameter") == estimate.argument_bytes


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("path", STEPS, ids=[p.name.removesuffix(".hlo") for p in STEPS])
def test_memory_top_and_the_plans_peak_holders_list_the_same_holders(path: Path, backend: str) -> None:
    prepared, result, estimate = _sized(path, backend)
    names = holder_names(prepared, result)
    holders = holders_at_peak(prepared.module, estimate, names)
    report = memory_report(prepared, top=10, result=result, estimate=estimate, names=names)
    assert report.num_holders == len(holders)
    assert [(b.kind, b.instruction, b.per_device_bytes) for b in report.top_buffers] == [
        (h.kind, h.label, h.per_device_bytes) for h in holders[:10]
    ]
    assert all(b.text and b.held and b.shard_shape == h.shard_shape for b, h in zip(report.top_buffers, holders))
    by_kind = {info.kind: info for info in peak_holders(prepared.module, estimate, names, top=3)}
    assert sum(info.per_device_bytes for info in by_kind.values()) == estimate.total_bytes
    for kind, info in by_kind.items():
        mine = [h for h in holders if h.kind == kind]
        # The heap's packing is no buffer's: the temporaries name it after their holders.
        packing = estimate.packing_bytes if kind == "temporaries" else 0
        assert info.items[: min(3, len(mine))] == [h.describe() for h in mine[:3]], kind
        assert len(info.items) == min(3, len(mine)) + (1 if packing else 0), kind
        if estimate.on_chip_bytes == 0:
            assert info.per_device_bytes == sum(h.per_device_bytes for h in mine) + packing, kind


def test_top_lists_as_many_as_asked_or_all_there_are() -> None:
    prepared, result, estimate = _sized(LLAMA_405B, "cpu")
    num_holders = len(holders_at_peak(prepared.module, estimate))
    for top, listed in ((3, 3), (40, 40), (10_000, num_holders)):
        report = memory_report(prepared, top=top, result=result, estimate=estimate)
        assert len(report.top_buffers) == listed


def _memory(*args: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "planner", "memory", *args, "--json"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_bundled_dump_lists_its_under_sharded_gradient_and_no_weight_as_a_gradient() -> None:
    report = _memory("--mesh", "fsdp=4,tp=2", "--top", "10")
    top = {b["instruction"]: b for b in report["top_buffers"]}
    # The plan's headline finding: the down projection's gradient, 4x its ideal, an output of the backward loop.
    gradient = top["while.2384[38]"]
    assert (gradient["kind"], gradient["category"], gradient["per_device_bytes"]) == (
        "stacked-gradients",
        "output",
        64 << 20,
    )
    assert gradient["shard_shape"] == [8, 512, 4096]
    # The forward loop's stacked weights are read, not written: not gradients.
    weights = [b for b in report["top_buffers"] if b["instruction"] in ("while.953[6]", "while.953[7]", "while.953[8]")]
    assert weights and all(b["kind"] == "other" and "the loop only reads" in b["text"] for b in weights)
    assert len(report["top_buffers"]) == 10


def test_the_405b_step_lists_its_gradients_by_name_and_its_conversion_per_device() -> None:
    report = _memory(str(LLAMA_405B), "--mesh", "fsdp=64,tp=4", "--top", "12")
    lines = report["top_buffers"]
    assert len(lines) == 12
    down = next(b for b in lines if b["instruction"] == "while.974[4]")
    assert down["name"] == "gradient of params['w_down']" and down["kind"] == "stacked-gradients"
    assert down["per_device_bytes"] == 126 * 13312 * 16384 * 2  # bf16[126,13312,16384]: 51.2 GiB
    converted = next(b for b in lines if b["instruction"] == "while.974[11] converted to f32")
    assert converted["shard_shape"] == [126, 1, 2048, 16384] and converted["held"] == "bf16[126,1,2048,16384]"
    assert converted["per_device_bytes"] == 126 * 2048 * 16384 * 2


def test_on_chip_memory_is_what_the_holders_exceed_the_total_by() -> None:
    prepared, _, estimate = _sized(LLAMA_405B, "v6e")
    assert estimate.on_chip_bytes > 0
    holders = holders_at_peak(prepared.module, estimate)
    assert (
        sum(h.per_device_bytes for h in holders)
        == estimate.total_bytes + estimate.on_chip_bytes - estimate.packing_bytes
    )


def test_the_mesh_named_changes_nothing_the_holders_add_up_to() -> None:
    prepared = prepare(parse_hlo_file(DEFAULT_DUMP), "cpu", Mesh.parse("fsdp=4,tp=2"))
    estimate = estimate_memory(prepared, propagate(prepared))
    holders = holders_at_peak(prepared.module, estimate)
    assert sum(h.per_device_bytes for h in holders) == estimate.total_bytes
