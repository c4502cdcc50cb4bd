"""Bytes live per device over program order: the memory model's peak, drawn as a line.

The numbers are the memory model's own (`estimate_memory`), read back, not modelled again. At
position p of the entry computation (text order is the schedule) a device holds

    arguments + outputs - aliased                        the whole step long
  + every entry temporary and loop-carried buffer live at p (start <= p <= end)
  + at a While, the peak of its body's (and condition's) own buffers,

less what on-chip memory holds (up to the backend's `alternate_memory_bytes` of temporaries, as the
report subtracts it at its peak). The report's temporaries are the largest such sum, so the top of
the entry series is the report's total, arguments + outputs + temporaries - aliased, and it is
reached at the report's peak position.

A While body's own series places the body's buffers on top of what the entry holds at that While
without them: at the body's peak it meets the entry series at the While. Worked example: arguments
and outputs of 100 MiB, a While at position 7 carrying 40 MiB whose body peaks at 30 MiB with its
own temporaries: the entry series is 170 MiB at position 7; the body series runs from 140 MiB (the
body holding nothing of its own) up to 170 MiB where its 30 MiB are live.

A While nested in a loop body (the layer scan inside a scan over microbatches) is drawn the same
way one level down: the model adds its body's peak at its position in the outer body, and its body's
series meets the outer body's series there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from planner.hlo.ir.module import Computation, HloModule
from planner.hlo.structure.loops import WhileLoop, while_loops
from planner.memory.buffers import Buffer
from planner.memory.communication import communication_buffers
from planner.memory.conversions import widened_bytes
from planner.memory.model import MemoryEstimate, body_span
from planner.memory.values import read_ends
from planner.propagation import PropagationResult
from planner.targets import Backend
from planner.targets import backend as backend_of

# Long computations are cut to about this many points: the smallest and the largest value of each
# stretch of program order, so the line keeps its dips, its peaks and the peak itself.
MAX_POINTS = 400


@dataclass(frozen=True)
class Timeline:
    """One computation's bytes live per device, after each of its instructions (possibly subsampled)."""

    computation: str
    label: str  # "entry", or "body of while.953 (8 trips)"
    positions: list[str]  # instruction names, in program order
    live_bytes: list[int]
    peak_index: int  # into positions: where the computation's peak is (the first, if several)

    @property
    def peak_bytes(self) -> int:
        return self.live_bytes[self.peak_index]


def timelines(
    module: HloModule, result: PropagationResult, estimate: MemoryEstimate, target: str | Backend = "cpu"
) -> list[Timeline]:
    """Read `estimate` (made by `estimate_module` from the same module, result and target) as timelines."""
    backend = backend_of(target)
    # Positions are the estimate's: in the order the compiler runs each computation.
    module = estimate.scheduled or module
    entry = module.entry
    live = _live(len(entry.instructions), [(b.start, b.end, b.size_bytes) for b in _entry_temporaries(estimate)])
    local = _body_live(module, result, estimate, backend)
    # The model's body peaks (nested loops' included): each adds at its While, in the entry or in the body
    # the While is nested in.
    peaks = estimate.body_peak_bytes
    nested: dict[str, list[WhileLoop]] = {}
    own: dict[str, list[int]] = {entry.name: live}
    for loop in while_loops(module):
        nested.setdefault(loop.computation, []).append(loop)
        for name in (loop.computation, loop.body):
            if name not in own:
                own[name] = list(local.get(name, [0] * len(module.computation(name).instructions)))
        at = _position(module.computation(loop.computation), loop.name)
        own[loop.computation][at] += peaks.get(loop.body, 0) + peaks.get(loop.condition, 0)
    # The heap's packing is part of the heap the whole step holds: every point carries it.
    base = estimate.argument_bytes + estimate.output_bytes - estimate.alias_bytes + estimate.packing_bytes
    on_chip = backend.alternate_memory_bytes

    def hbm(temporaries: int) -> int:
        return base + max(temporaries - on_chip, 0)

    series = [_series(entry, "entry", live, hbm)]
    # Each body on top of what its parent holds at its While without the body's own peak.
    pending = [(loop, live[k]) for loop in nested.get(entry.name, [])
               for k in [_position(entry, loop.name)]]  # fmt: skip
    while pending:
        loop, at_while = pending.pop(0)
        body = module.computation(loop.body)
        below = at_while - peaks.get(loop.body, 0)
        values = [below + x for x in own[loop.body]]
        trips = f"{loop.trip_count} trips" if loop.trip_count is not None else "trip count unknown"
        series.append(_series(body, f"body of {loop.name} ({trips})", values, hbm))
        pending += [(inner, values[_position(body, inner.name)]) for inner in nested.get(loop.body, [])]
    return series


def _position(comp: Computation, name: str) -> int:
    return next(k for k, inst in enumerate(comp.instructions) if inst.name == name)


def _entry_temporaries(estimate: MemoryEstimate) -> list[Buffer]:
    """What the model sums at each entry position (its `temps`): not those held in an output's allocation."""
    return [
        b
        for b in estimate.buffers
        if b.start >= 0 and b.category in ("temporary", "loop-carried") and b.id not in estimate.in_live_out
    ]


def _body_live(
    module: HloModule, result: PropagationResult, estimate: MemoryEstimate, backend: Backend
) -> dict[str, list[int]]:
    """Per loop body or condition: its own buffers and the partitioner's spans live at each position.

    The model's body peak (`_local_peak`) is the largest of these.
    """
    communication = communication_buffers(module, result, _reachable(module), backend)
    names = {b.computation for b in estimate.buffers if b.start < 0} | (set(communication) - {module.entry_name})
    out = {}
    for name in names:
        comp = module.computation(name)
        positions = {inst.name: k for k, inst in enumerate(comp.instructions)}
        ends = read_ends(comp, estimate.fused, positions)
        spans = [(s.start, s.end, widened_bytes(s.size_bytes, s.shape, backend)) for s in communication.get(name, [])]
        for b in estimate.buffers:
            if b.start >= 0 or b.computation != name:
                continue
            spans.append((*body_span(comp, positions, b, ends), b.size_bytes))
        out[name] = _live(len(comp.instructions), spans)
    return out


def _reachable(module: HloModule) -> list[str]:
    """The entry and every While body and condition reachable from it (the computations the model walks)."""
    order, stack = [], [module.entry_name]
    while stack:
        name = stack.pop()
        if name in order:
            continue
        order.append(name)
        for inst in module.computation(name).instructions:
            if inst.opcode == "while":
                stack += [inst.attr("body").names[0], inst.attr("condition").names[0]]
    return order


def _live(length: int, spans: list[tuple[int, int, int]]) -> list[int]:
    """Bytes live at each position, from (start, end, bytes) spans, both ends included; a span held to the
    step's end (`end == length`, SparseCore's tables) is live to its last position, as `peak_of_spans` reads it."""
    delta = [0] * (length + 1)
    for start, end, size in spans:
        if end < start or start >= length:
            continue
        delta[max(start, 0)] += size
        delta[min(end, length - 1) + 1] -= size
    live, running = [], 0
    for d in delta[:length]:
        running += d
        live.append(running)
    return live


def _series(comp: Computation, label: str, temporaries: list[int], hbm: Callable[[int], int]) -> Timeline:
    names = [inst.name for inst in comp.instructions]
    peak = max(range(len(temporaries)), key=lambda p: (temporaries[p], -p)) if temporaries else 0
    keep = subsample(temporaries, peak)
    return Timeline(comp.name, label, [names[p] for p in keep], [hbm(temporaries[p]) for p in keep], keep.index(peak))


def subsample(values: list[int], peak: int, max_points: int = MAX_POINTS) -> list[int]:
    """Positions to keep, in order: all of them when few, else each stretch's lowest and highest, and `peak`."""
    if len(values) <= max_points:
        return list(range(len(values)))
    stretches = max_points // 2
    keep = {peak}
    for k in range(stretches):
        lo, hi = k * len(values) // stretches, (k + 1) * len(values) // stretches
        stretch = range(lo, hi)
        keep.add(min(stretch, key=lambda p: (values[p], p)))
        keep.add(max(stretch, key=lambda p: (values[p], -p)))
    return sorted(keep)
