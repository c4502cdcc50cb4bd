"""What XLA:TPU's heap allocator adds over the bytes live at its peak.

XLA:TPU places its temporaries in one heap; the heap is larger than the most bytes its buffers hold at once,
by what packing buffers of many sizes and lifetimes into one address range costs. libtpu's allocator is closed,
so the cost is measured (`fidelity.heap_packing`): over MaxText steps compiled by libtpu 0.0.52, the heap
(`preallocated-temp` in memory space 0) against the bytes its buffers cover at once by their live ranges.
It is 0.1-1% on steps of 32 to 126 layers and 0.4-11.5% on steps of 2 to 8: the buffers paid once per step
(the logits, their gradient, the gathered embedding, the optimizer's copies) come and go around the layer
scans, and the fewer the layers, the more of the peak they are. Best-fit packing of XLA:TPU's own live ranges
(largest first) comes within 0.1-0.3 GiB of its live peak, not of its heap: the allocator's order is not that.

The model is proportional to one over the step's layer count (the longest loop's trip count):
`PACKING_PER_LAYER / layers`, fitted on one half of the measured steps and checked on the other. A line with an
intercept fits the half it is fitted on as well and does worse on the other: it keeps 1.7% at any size, where the
full-size steps measured pack 0.1-1%. `python -m fidelity.heap_packing` prints the fit, both halves' errors and the
other features tried (the share of the peak its largest buffers hold, how many buffers make it): bench/RESULTS.md
has them.
"""

from __future__ import annotations

from planner.hlo.ir.module import HloModule
from planner.hlo.structure.loops import while_loops

# Fitted by `python -m fidelity.heap_packing` on the fit half of the MaxText steps (see its output).
PACKING_PER_LAYER = 0.1388


def packing_fraction(layers: int) -> float:
    """The heap's size over its live peak, less one, for a step of this many layers."""
    return PACKING_PER_LAYER / max(layers, 1)


def layer_count(module: HloModule) -> int:
    """The step's layers as its loops say: the longest trip count (1 with no counted loop)."""
    return max((loop.trip_count or 1 for loop in while_loops(module)), default=1)


def packing_bytes(live_peak_bytes: int, layers: int) -> int:
    """What packing adds to a heap whose live peak is `live_peak_bytes`."""
    return round(packing_fraction(layers) * live_peak_bytes)
