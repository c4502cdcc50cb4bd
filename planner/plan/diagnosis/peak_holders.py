"""What holds the memory at the peak, by kind: the memory model's own buffers, named.

The holders are `planner.memory.holders`' (the ones `spmd-planner memory --top` lists): every entry
parameter, every output, and every temporary live at the peak, each sorted into a kind
(saved-activations, stacked-gradients, parameters, optimizer-state, outputs, temporaries, other).
Here they are summed per kind; the kinds add up to the report's HBM per chip. The backend's on-chip
memory holds up to `on_chip_bytes` of the peak, temporaries first (XLA:TPU's memory-space assignment
places them); the model does not say which loop-carried buffer holds any rest, so it comes off the
loop-carried kinds, largest first.
Each item names the buffer as the memory report does (`while.513[10]`, a loop element) with its
per-device shape, and, when the dump's metadata has them, the user's name (JAX's op_name on the
entry parameter it comes from, e.g. `params['wq']`) and the source line that produces it.
"""

from __future__ import annotations

from planner.hlo.ir.module import HloModule
from planner.memory.holders import (
    CARRIED_KINDS,
    KINDS,
    Holder,
    SavedActivation,
    gradient_names,
    holders_at_peak,
    loops_by_name,
    loops_of,
    saved_activations,
)
from planner.memory.model import MemoryEstimate
from planner.plan.diagnosis.scan_pairs import StackedGradient, stacked_gradients
from planner.plan.model import PeakHolderInfo
from planner.prepare import PreparedModule
from planner.propagation import PropagationResult
from planner.units import format_bytes

__all__ = [
    "KINDS",
    "SavedActivation",
    "gradient_names",
    "holder_names",
    "loops_by_name",
    "loops_of",
    "peak_holders",
    "saved_activations",
    "stacked_gradient_names",
]


def peak_holders(
    module: HloModule,
    estimate: MemoryEstimate,
    names: dict[str, str] | None = None,
    top: int = 3,
) -> list[PeakHolderInfo]:
    """The peak's bytes per device by kind, largest first; they add up to the estimate's total.

    `names` names stacked-gradient loop elements (`while.1044[4]`) by their parameter (`gradient_names`).
    """
    holders = holders_at_peak(module, estimate, names)
    totals = dict.fromkeys(KINDS, 0)
    items: dict[str, list[Holder]] = {k: [] for k in KINDS}
    for h in holders:
        totals[h.kind] += h.per_device_bytes
        items[h.kind].append(h)
    # On-chip memory holds part of the temporaries' peak: the temporaries kind first, then the loop-carried kinds.
    at_peak = {k: sum(h.per_device_bytes for h in items[k] if h.buffer.category in _PEAK) for k in KINDS}
    rest = estimate.on_chip_bytes
    for kind in ["temporaries", *sorted(CARRIED_KINDS, key=lambda k: -at_peak[k])]:
        taken = min(rest, at_peak[kind])
        totals[kind] -= taken
        rest -= taken
    texts = {k: [h.describe() for h in items[k][:top]] for k in KINDS}
    if estimate.packing_bytes:
        totals["temporaries"] += estimate.packing_bytes
        packing = format_bytes(estimate.packing_bytes)
        texts["temporaries"].append(f"{packing} the heap's packing adds (XLA:TPU's allocator)")
    unnamed = estimate.total_bytes - sum(totals.values())
    if unnamed:
        # Bytes the model counts at the peak without a buffer to show for them: said, not hidden.
        totals["temporaries"] += unnamed
        texts["temporaries"].append(f"{format_bytes(unnamed)} the memory model counts without a buffer to name")
    found = [PeakHolderInfo(kind=k, per_device_bytes=totals[k], items=texts[k]) for k in KINDS if totals[k]]
    return sorted(found, key=lambda h: -h.per_device_bytes)


# The categories of the peak's temporaries (parameters and outputs count whole, wherever the peak is).
_PEAK = ("temporary", "loop-carried")


def stacked_gradient_names(module: HloModule, gradients: list[StackedGradient]) -> dict[str, str]:
    """Each stacked gradient's buffer (`while.1044[4]`) to its parameter's user name (`params['w_down']`)."""
    loops = loops_by_name(module)
    pairs = [
        (g.key, loops[g.parameter.loop], g.parameter.index)
        for g in gradients
        if g.parameter is not None and g.parameter.loop in loops
    ]
    return gradient_names(module, pairs)


def holder_names(prepared: PreparedModule, result: PropagationResult) -> dict[str, str]:
    """`stacked_gradient_names` of the step's stacked gradients as the plan finds them (no manifest)."""
    return stacked_gradient_names(prepared.module, stacked_gradients(prepared.module, result, None, prepared.mesh))
