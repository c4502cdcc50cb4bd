"""XLA:TPU's own peak, read from its dumps: where its live ranges peak and what each memory space holds there.

    python -m fidelity.xla_peak DUMP_DIR [--top N]

DUMP_DIR is an `--xla_dump_to` folder of a TPU compile that dumped every pass (`fidelity.run_maxtext
--keep-dumps` keeps one per step). Two of its files are read:
- `*after_optimizations-live-range.txt` (XLA's `HloLiveRange`): each value's live range over the
  flattened schedule, and the position XLA names as the peak;
- `*after_optimizations-buffer-assignment.txt`: each value's allocation, size and memory space
  (`color`: 0 is HBM, 1 the on-chip VMEM).
It prints the values live at that peak, summed per memory space, beside what the buffer assignment
allocates in HBM (`planner.plan.compilers.xla_compile.hbm_allocated_bytes`, the total XLA:TPU checks against
the chip), and the HBM heap (the temporaries' allocation) beside the most its values hold at once by
their live ranges: the difference is how XLA:TPU packed the heap. The live-range peak leaves out
entry parameters after their last use, whose allocations the caller still holds, so it is not the
HBM total. What the model should reproduce is the HBM total; this is where to look when it does not:
which values XLA held at its peak, how much of them it kept in VMEM rather than HBM, and how much its
heap's packing adds.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from planner.plan.compilers.xla_compile import hbm_allocated_bytes

_PEAK = re.compile(r"^\s*Live ranges at (\d+) \(peak\):", re.M)
_RANGE = re.compile(r"^    (\S+?)(\{[^}]*\}):(\d+)-(\d+)$", re.M)
_SEQUENCE = re.compile(r"^    (\d+):(\S+)$", re.M)
_ALLOCATION = re.compile(r"^allocation \d+: size (\d+)(?:, color (\d+))?(.*)")
_VALUE = re.compile(r"^ value: <\d+ (\S+?)(\{[^}]*\})?(?: \(phi\))? @\d+> \(size=(\d+),offset=(\d+)\)(?:: (\S+))?")


@dataclass
class Peak:
    """The values live at XLA's live-range peak, by memory space."""

    position: int
    instruction: str | None
    hbm_allocated_bytes: int | None
    # memory space -> [(bytes, value)], largest first
    live: dict[int, list[tuple[int, str]]] = field(default_factory=dict)
    # XLA:TPU's HBM heap (the temporaries' allocation in memory space 0) and the most its values hold at
    # once by their live ranges: the difference is how the heap was packed.
    heap_bytes: int = 0
    heap_live_peak_bytes: int = 0
    # The heap's values live where they cover the most bytes (one per buffer: shared bytes counted once),
    # largest first: what the allocator had to place at its fullest moment.
    heap_live_peak_sizes: list[int] = field(default_factory=list)
    # How many values the heap placed over the whole step.
    heap_value_count: int = 0

    def bytes_in(self, color: int) -> int:
        return sum(size for size, _ in self.live.get(color, ()))


def read_peak(live_range: str, buffer_assignment: str) -> Peak:
    """The values of `buffer_assignment` live at the peak `live_range` names, by memory space.

    Raises ValueError when the live-range text names no peak."""
    found = _PEAK.search(live_range)
    if found is None:
        raise ValueError("the live-range dump names no peak ('Live ranges at N (peak):' is missing)")
    position = int(found.group(1))
    ranges = {(m.group(1), m.group(2)): (int(m.group(3)), int(m.group(4))) for m in _RANGE.finditer(live_range)}
    sequence = {int(m.group(1)): m.group(2) for m in _SEQUENCE.finditer(live_range[: found.start()])}
    live: dict[int, list[tuple[int, str]]] = {}
    heap_bytes = 0
    heap_values: list[tuple[int, int, int, int]] = []  # (start, end, offset, size) of each heap value
    color, in_heap = None, False
    for line in buffer_assignment.splitlines():
        allocation = _ALLOCATION.match(line)
        if allocation is not None:
            color = int(allocation.group(2) or 0)
            in_heap = color == 0 and "preallocated-temp" in allocation.group(3)
            heap_bytes += int(allocation.group(1)) if in_heap else 0
            continue
        value = _VALUE.match(line)
        if value is None or color is None:
            continue
        name, index, size = value.group(1), value.group(2) or "{}", int(value.group(3))
        span = ranges.get((name, index))
        if span is None:
            continue
        if span[0] <= position <= span[1]:
            live.setdefault(color, []).append((size, name + (index if index != "{}" else "")))
        if in_heap:
            heap_values.append((span[0], span[1], int(value.group(4)), size))
    for values in live.values():
        values.sort(key=lambda v: (-v[0], v[1]))
    fullest = max({v[0] for v in heap_values}, key=lambda at: (_covered(heap_values, at), -at), default=None)
    sizes = _buffer_sizes(heap_values, fullest) if fullest is not None else []
    return Peak(position, sequence.get(position), hbm_allocated_bytes(buffer_assignment), live, heap_bytes,
                sum(sizes), sizes, len({(offset, size) for _, _, offset, size in heap_values}))  # fmt: skip


def _covered(values: list[tuple[int, int, int, int]], at: int) -> int:
    """Heap bytes the values live at `at` cover. Values of one buffer (a loop's carried value and the
    body's parameter, an in-place update and its operand) share their bytes: counted once."""
    return sum(_buffer_sizes(values, at))


def _buffer_sizes(values: list[tuple[int, int, int, int]], at: int) -> list[int]:
    """The bytes each stretch of the heap live at `at` covers, largest first: values that overlap in the
    heap are one buffer (their union)."""
    spans = sorted((offset, offset + size) for start, end, offset, size in values if start <= at <= end)
    sizes: list[int] = []
    reach = 0
    for lo, hi in spans:
        if lo >= reach:
            sizes.append(hi - lo)
        elif hi > reach:
            sizes[-1] += hi - reach
        reach = max(reach, hi)
    return sorted(sizes, reverse=True)


def thread_local_allocations(buffer_assignment: str, least: int = 1 << 20) -> list[dict[str, object]]:
    """HBM allocations (memory space 0) of `least` bytes or more outside the heap that belong to a computation
    run on its own thread (SparseCore's offloaded gathers): each with its size and its values, `name: shape`."""
    found: list[dict[str, object]] = []
    values: list[str] | None = None
    for line in buffer_assignment.splitlines():
        allocation = _ALLOCATION.match(line)
        if allocation is not None:
            values = None
            size, color, kind = int(allocation.group(1)), int(allocation.group(2) or 0), allocation.group(3)
            if color == 0 and size >= least and "thread-local" in kind:
                values = []
                found.append({"bytes": size, "values": values})
            continue
        value = _VALUE.match(line)
        if value is not None and values is not None:
            values.append(f"{value.group(1)}{value.group(2) or ''}: {value.group(5)}")
    return found


def read_dump(directory: Path) -> Peak:
    """`read_peak` on the step's files in an XLA dump folder (the largest module's, as the compile reports)."""

    def largest(pattern: str) -> Path:
        paths = sorted(directory.glob(pattern), key=lambda p: p.stat().st_size)
        if not paths:
            raise ValueError(f"{directory}: no {pattern} (dump every pass: --xla_dump_hlo_pass_re=.*)")
        return paths[-1]

    return read_peak(
        largest("*after_optimizations-live-range.txt").read_text(),
        largest("*after_optimizations-buffer-assignment.txt").read_text(),
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dump", type=Path, help="an XLA dump folder of a TPU compile")
    ap.add_argument("--top", type=int, default=10, help="how many of each memory space's largest values to list")
    args = ap.parse_args(argv)
    try:
        peak = read_dump(args.dump)
    except (OSError, ValueError) as e:
        print(f"xla_peak: {e}", file=sys.stderr)
        return 2
    print(json.dumps({
        "position": peak.position,
        "instruction": peak.instruction,
        "hbm_allocated_bytes": peak.hbm_allocated_bytes,
        "live_bytes_by_memory_space": {str(c): peak.bytes_in(c) for c in sorted(peak.live)},
        "heap_bytes": peak.heap_bytes,
        "heap_live_peak_bytes": peak.heap_live_peak_bytes,
        "heap_live_peak_buffers": len(peak.heap_live_peak_sizes),
        "heap_value_count": peak.heap_value_count,
        "largest": {str(c): v[: args.top] for c, v in sorted(peak.live.items())},
    }, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
