"""Temporaries XLA:CPU's buffer assignment places in the allocations of outputs and donated parameters.

XLA's `BufferAssigner` gives every live-out buffer an allocation of its own, and every entry parameter an
output is written into (aliased or paired with a donor) one it may reuse. It then walks every other buffer,
largest first, and tries it in those allocations, smallest first (`AssignSingleHloBuffer`): a buffer goes
where it fits in size and its live range overlaps none of the values already there (`MaybeAssignBuffer`,
`LiveRangeInterferes`). Only what fits nowhere is left to the heap whose peak the temporaries' allocation
is.

An output's allocation is free until the output is written, so a step that returns its gradients holds
forward-pass temporaries in the gradients' allocations; a donated parameter's allocation is free between
the parameter's last read and the write of the output paired with it.

Worked example: a plain-loop step returns four 2 MiB weight gradients, written in the backward pass at
positions 600-700 of 800. Breadth-first, XLA:CPU gathers each layer's 2 MiB weights at the top of the step
(positions 10-40), to be read by the forward dots at 100-400. Each gathered weight fits a gradient's
allocation, free until 600: all four go there, and the heap holds none of them (on a torch_xla Llama step,
the forward's gathered weights sit in the gradients' allocations and XLA:CPU's heap is 33 MiB, not 67).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, field

from planner.memory.buffers import Buffer


@dataclass
class LiveOutAllocation:
    """An output's allocation (with its donated parameter's): its size and the positions its values hold it."""

    size_bytes: int
    busy: list[tuple[int, int]] = field(default_factory=list)  # inclusive (first, last) positions

    def takes(self, start: int, end: int) -> bool:
        """Whether a value live over [start, end] overlaps none already here."""
        return all(end < first or last < start for first, last in self.busy)


def place_in_live_out_allocations(temporaries: Sequence[Buffer], allocations: Sequence[LiveOutAllocation]) -> set[int]:
    """Which of `temporaries` (their indices) XLA places in `allocations`, taken in XLA's order.

    Largest buffer first (ties: the earlier defined), each in the smallest allocation that holds it and is
    free over its whole live range; `allocations` gain the positions of what they take.
    """
    by_size = sorted(allocations, key=lambda a: a.size_bytes)
    sizes = [a.size_bytes for a in by_size]
    placed: set[int] = set()
    for k in sorted(range(len(temporaries)), key=lambda k: (-temporaries[k].size_bytes, temporaries[k].start)):
        buffer = temporaries[k]
        for allocation in by_size[bisect_left(sizes, buffer.size_bytes) :]:
            if allocation.takes(buffer.start, buffer.end):
                allocation.busy.append((buffer.start, buffer.end))
                placed.add(k)
                break
    return placed
