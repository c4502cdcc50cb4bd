"""HBM per chip for a module: the estimate, broken down, against a chip's capacity.

Numbers are per device, in the terms of XLA's compiled memory stats:
arguments + outputs + temporaries - aliased bytes.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from planner.chip_labels import chips_text
from planner.hlo.ir.module import HloModule
from planner.memory.buffers import Buffer, array_leaves, leaf_shardings, per_device_bytes, sharding_of
from planner.memory.estimation import estimate_memory
from planner.memory.holders import holders_at_peak
from planner.memory.model import MemoryEstimate
from planner.prepare import PreparedModule
from planner.propagation import PropagationResult, propagate
from planner.targets import backend as backend_of
from planner.units import format_bytes


@dataclass(frozen=True)
class BufferLine:
    """One holder of the peak (`planner.memory.holders`), as text at the edge."""

    instruction: str  # the buffer as the model names it: an instruction, or a loop element `while.953[30]`
    computation: str
    category: str  # the memory model's: parameter, output, loop-carried or temporary
    shape: str  # the value's, all devices together (a partitioner's buffer: its per-device one)
    sharding: str
    per_device_bytes: int
    stacked: bool
    kind: str = "temporaries"  # what holds it (`holders.KINDS`)
    name: str | None = None  # the user's name, or what the buffer is of one (`gradient of params['wq']`)
    shard_shape: tuple[int, ...] = ()  # per device, as held
    held: str = ""  # the per-device array as held: per_device_bytes is its size unless `note` says otherwise
    note: str | None = None
    text: str = ""  # the holder in words, as the plan's peak holders name it (without its bytes)


@dataclass(frozen=True)
class Unmodelled:
    """An instruction whose sharding or memory the model only approximates, and the bytes it counts for it."""

    instruction: str
    opcode: str
    per_device_bytes: int
    reason: str


@dataclass(frozen=True)
class ErrorBand:
    """How far the model has been from the real compiler: |ours - compiler| / compiler over the sweep."""

    compiler: str
    num_cases: int
    p90: float
    max: float


@dataclass(frozen=True)
class MemoryReport:
    num_devices: int
    mesh: str | None
    argument_bytes: int
    output_bytes: int
    temp_bytes: int
    alias_bytes: int
    total_bytes: int
    per_chip_bytes: dict[int, int]
    capacity_bytes: int | None
    # Bytes live at the peak, by what holds them.
    breakdown: dict[str, int]
    # The largest of the buffers holding the peak (`holders_at_peak`): parameters, outputs, temporaries.
    top_buffers: tuple[BufferLine, ...]
    backend: str = "cpu"
    # How many buffers hold the peak: `top_buffers` are the largest of them.
    num_holders: int = 0
    unmodelled: tuple[Unmodelled, ...] = ()
    error_band: ErrorBand | None = None
    # Per device in host memory at its peak (host offload: `planner.memory.host_offload`), not in the HBM above.
    host_bytes: int = 0

    @property
    def peak_chip_bytes(self) -> int:
        return max(self.per_chip_bytes.values())

    @property
    def headroom_bytes(self) -> int | None:
        return None if self.capacity_bytes is None else self.capacity_bytes - self.peak_chip_bytes

    def over_capacity(self) -> list[int]:
        if self.capacity_bytes is None:
            return []
        return [d for d, b in self.per_chip_bytes.items() if b > self.capacity_bytes]

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["per_chip_bytes"] = {str(k): v for k, v in self.per_chip_bytes.items()}
        data["headroom_bytes"] = self.headroom_bytes
        data["over_capacity"] = self.over_capacity()
        return data


def memory_report(
    prepared: PreparedModule,
    capacity_bytes: int | None = None,
    top: int = 10,
    result: PropagationResult | None = None,
    estimate: MemoryEstimate | None = None,
    names: Mapping[str, str] | None = None,
) -> MemoryReport:
    """Size every chip of the prepared module for its target (propagating first unless `result` is given).

    The target is `cpu` for XLA:CPU, or a chip preset (v6e, v5p, ...) for the compiler that chip
    runs; `estimate`, when given, is `estimate_memory(prepared, result)` already made. `top` of the
    buffers holding the peak are listed; `names` names stacked gradients by their buffer
    (`while.1044[4]` -> `params['w_down']`, as `planner.plan.diagnosis.peak_holders.holder_names` finds them).
    """
    result = result if result is not None else propagate(prepared)
    estimate = estimate if estimate is not None else estimate_memory(prepared, result)
    return _report(prepared, estimate, capacity_bytes, top, _unmodelled(prepared.module, result), names)


def _unmodelled(module: HloModule, result: PropagationResult) -> tuple[Unmodelled, ...]:
    """Instructions propagation has no rule for: their sharding is XLA's default (replicated) at best a guess."""
    lines = []
    for name, reason in result.unknown.items():
        try:
            inst = module.instruction(name)
        except KeyError:  # renamed or removed by propagation (a Sharding custom-call became a copy)
            continue
        shardings = leaf_shardings(inst.shape, sharding_of(result, name))
        size = sum(per_device_bytes(leaf, s) for leaf, s in zip(array_leaves(inst.shape), shardings))
        lines.append(Unmodelled(name, inst.opcode, size, reason))
    return tuple(sorted(lines, key=lambda u: -u.per_device_bytes))


ACCURACY_FILE = Path(__file__).resolve().parents[1] / "data" / "memory_accuracy.json"


# The fewest reference steps a kind's own signed band is trusted on; fewer, and the compiler's band is used.
MIN_KIND_CASES = 5


@functools.cache
def signed_error(compiler: str, kinds: tuple[str, ...]) -> tuple[str, int, float, float] | None:
    """(kind measured, steps, most under, most over): the sweep's signed error, (ours - compiler) / compiler, for
    this compiler on the first of `kinds` (`partitioner/front end`, e.g. `gspmd/jax`, most specific first) with
    at least `MIN_KIND_CASES` steps measured, else over all its steps; None when the sweep recorded none."""
    if not ACCURACY_FILE.exists():
        return None
    bands = json.loads(ACCURACY_FILE.read_text()).get(compiler)
    if bands is None or "under" not in bands:
        return None
    recorded = bands.get("kinds", {})
    for kind in kinds:
        own = recorded.get(kind) if not kind.startswith(ANY_PARTITIONER) else _pooled(recorded, kind)
        if own is not None and own["num_cases"] >= MIN_KIND_CASES:
            return kind, own["num_cases"], own["under"], own["over"]
    return "all", bands["num_cases"], bands["under"], bands["over"]


@functools.cache
def reference_steps(compiler: str, front_end: str) -> tuple[dict, ...]:
    """The reference steps of `front_end` (every partitioner) whose traits the sweep recorded beside their signed
    error (`steps` of a kind: MaxText's), as written."""
    if not ACCURACY_FILE.exists():
        return ()
    kinds = json.loads(ACCURACY_FILE.read_text()).get(compiler, {}).get("kinds", {})
    return tuple(step for name, own in sorted(kinds.items()) if name.endswith(f"/{front_end}")
                 for step in own.get("steps", ()))  # fmt: skip


# The breakdown's line for what the compiler's heap adds over its live peak (`planner.memory.heap_packing`).
HEAP_PACKING = "the heap's packing (XLA:TPU's allocator)"


# A kind `*/front end` pools that front end's steps under every partitioner.
ANY_PARTITIONER = "*/"


def _pooled(recorded: dict[str, dict], kind: str) -> dict | None:
    """Every partitioner's `front end` kind together: their steps, the most under and the most over of them."""
    front_end = kind.removeprefix(ANY_PARTITIONER)
    kinds = [own for name, own in recorded.items() if name.endswith(f"/{front_end}")]
    if not kinds:
        return None
    return {
        "num_cases": sum(own["num_cases"] for own in kinds),
        "under": min(own["under"] for own in kinds),
        "over": max(own["over"] for own in kinds),
    }


@functools.cache
def error_band(compiler: str) -> ErrorBand | None:
    """The sweep's measured error for this compiler (`python -m fidelity.sweep --write` records it)."""
    if not ACCURACY_FILE.exists():
        return None
    band = json.loads(ACCURACY_FILE.read_text()).get(compiler)
    return None if band is None else ErrorBand(compiler, band["num_cases"], band["p90"], band["max"])


def _report(
    prepared: PreparedModule,
    estimate: MemoryEstimate,
    capacity: int | None,
    top: int,
    unmodelled: tuple[Unmodelled, ...],
    names: Mapping[str, str] | None = None,
) -> MemoryReport:
    trips = {loop.name: loop.trip_count for loop in prepared.loops}
    mesh, backend = prepared.mesh, prepared.target.name

    def stacked(b: Buffer) -> bool:
        count = trips.get(b.loop) if b.loop else None
        return count is not None and b.shape.rank >= 2 and b.shape.dims[0] == count

    breakdown = {
        "parameters": estimate.argument_bytes,
        "outputs": estimate.output_bytes,
        "loop-carried": sum(b.size_bytes for b in estimate.peak_buffers if b.category == "loop-carried"),
        "loop-carried stacked [L, ...]": sum(
            b.size_bytes for b in estimate.peak_buffers if b.category == "loop-carried" and stacked(b)
        ),
    }
    breakdown["temporaries"] = (
        estimate.temp_bytes + estimate.on_chip_bytes - estimate.packing_bytes - breakdown["loop-carried"]
    )
    if estimate.on_chip_bytes:
        breakdown["held in on-chip memory, not HBM"] = -estimate.on_chip_bytes
    if estimate.packing_bytes:
        breakdown[HEAP_PACKING] = estimate.packing_bytes
    holders = holders_at_peak(prepared.module, estimate, names)
    lines = tuple(
        BufferLine(
            h.label,
            b.computation,
            b.category,
            b.shape.to_text(with_layout=False),
            b.sharding.to_short_text() if b.sharding is not None else "{replicated}",
            b.size_bytes,
            stacked(b),
            kind=h.kind,
            name=h.name,
            shard_shape=h.shard_shape,
            held=b.held.to_text(with_layout=False),
            note=b.note,
            text=h.describe(with_bytes=False),
        )
        for h in holders[: max(top, 0)]
        for b in (h.buffer,)
    )
    return MemoryReport(
        num_devices=len(estimate.per_chip_bytes),
        mesh=mesh.to_text() if mesh is not None else None,
        argument_bytes=estimate.argument_bytes,
        output_bytes=estimate.output_bytes,
        temp_bytes=estimate.temp_bytes,
        alias_bytes=estimate.alias_bytes,
        total_bytes=estimate.total_bytes,
        per_chip_bytes=estimate.per_chip_bytes,
        capacity_bytes=capacity,
        breakdown=breakdown,
        top_buffers=lines,
        backend=backend,
        num_holders=len(holders),
        unmodelled=unmodelled,
        error_band=error_band(prepared.compiler),
        host_bytes=estimate.host_bytes,
    )


def render_memory(report: MemoryReport) -> str:
    mib = format_bytes  # one unit policy (planner.units): binary units chosen per magnitude

    where = f" on mesh {report.mesh}" if report.mesh else ""
    lines = [
        f"HBM per chip ({report.num_devices} devices{where}), in XLA's terms (argument + output + temp - alias):",
        f"  arguments    {mib(report.argument_bytes):>14}",
        f"  outputs      {mib(report.output_bytes):>14}",
        f"  temporaries  {mib(report.temp_bytes):>14}  (peak of buffers live at once)",
        f"  total        {mib(report.total_bytes):>14}",
    ]
    if report.host_bytes:
        lines.append(f"  host memory  {mib(report.host_bytes):>14}  (offloaded: held in the host's memory, not in HBM)")
    if report.capacity_bytes is not None:
        over = [str(c) for c in report.over_capacity()]
        total = len(report.per_chip_bytes)
        verdict = (
            f"OVER capacity on {chips_text(over, total)}" if over else f"headroom {mib(report.headroom_bytes or 0)}"
        )
        lines.append(f"  capacity     {mib(report.capacity_bytes):>14}  {verdict}")
    by_value: dict[int, list[str]] = {}
    for chip, value in report.per_chip_bytes.items():
        by_value.setdefault(value, []).append(str(chip))
    if len(by_value) > 1:
        groups = sorted(by_value.items(), reverse=True)
        shown = [f"{chips_text(chips, len(report.per_chip_bytes))}: {mib(value)}" for value, chips in groups[:4]]
        more = f"; {len(groups) - 4} more groups below" if len(groups) > 4 else ""
        lines.append("  per chip: " + "; ".join(shown) + more)
    lines.append("  at the peak:")
    for name, value in report.breakdown.items():
        lines.append(f"    {name:<30} {mib(value):>14}")
    compiler = {"cpu": "XLA:CPU", "tpu": "XLA:TPU", "gpu": "XLA:GPU"}[backend_of(report.backend).compiler]
    band = report.error_band
    if band is not None:
        lines.append(f"  predicted for {compiler} ({report.backend}): within {band.p90:.0%} on 90% of "
                     f"{band.num_cases} reference steps, {band.max:.0%} at worst")  # fmt: skip
    else:
        lines.append(f"  predicted for {compiler} ({report.backend}): no measured error band for this compiler")
    if report.unmodelled:
        total = sum(u.per_device_bytes for u in report.unmodelled)
        lines.append(f"  not modelled ({len(report.unmodelled)} instructions, {mib(total)} counted as XLA's "
                     "default, replicated):")  # fmt: skip
        for u in report.unmodelled[:10]:
            lines.append(f"    {mib(u.per_device_bytes):>12}  {u.instruction} ({u.opcode}): {u.reason}")
    listed = len(report.top_buffers)
    lines.append(f"  largest buffers live at the peak ({listed} of the {report.num_holders} that hold it):")
    for b in report.top_buffers:
        sharding = f" {b.sharding}" if b.sharding != "{replicated}" else ""
        lines.append(f"    {mib(b.per_device_bytes):>12}  {b.kind:<17}  {b.text}{sharding}")
    return "\n".join(lines)
