"""What holds a MaxText step's peak, named as MaxText names it: parameters and AdamW's moments by their path in
MaxText's params tree, temporaries by the Flax module path and op their op_name records
(`decoder/logits_dense/dot_general`), each with its per-chip shape and bytes."""

from __future__ import annotations

from planner.hlo.ir.debug_info import short_op_name
from planner.hlo.ir.module import HloModule
from planner.memory.holders import Holder
from planner.plan.model import PeakHolderInfo
from planner.units import format_bytes
from scan_runtime.maxtext.terms import parameter_name

# The peak's kinds as a MaxText user reads them.
KIND_NAMES = {
    "saved-activations": "saved activations (what remat_policy keeps)",
    "stacked-gradients": "gradients",
    "parameters": "parameters",
    "optimizer-state": "AdamW state",
    "temporaries": "temporaries",
    "outputs": "outputs",
    "other": "other",
}
TOP = 3


def holder_name(module: HloModule, holder: Holder) -> str:
    """`decoder/layers/mlp/wi_0/kernel`, `Adam mu of ...`, or a temporary's module path and op."""
    if holder.name:
        return parameter_name(holder.name)
    buffer = holder.buffer
    instruction = buffer.defined_by.split(":", 1)[0].split("[", 1)[0]
    op = None
    if buffer.computation in {c.name for c in module.computations}:
        comp = module.computation(buffer.computation)
        if instruction in comp:
            metadata = comp[instruction].metadata
            op = short_op_name(metadata.op_name) if metadata is not None else None
    return op or buffer.defined_by


def describe(module: HloModule, holder: Holder) -> str:
    held = holder.buffer.held.to_text(with_layout=False)
    return f"{holder_name(module, holder)} {held} {format_bytes(holder.per_device_bytes)}"


def maxtext_holders(
    module: HloModule, totals: list[PeakHolderInfo], holders: list[Holder]
) -> list[tuple[str, int, list[str]]]:
    """(kind as MaxText's user reads it, bytes per chip, the largest few named) per kind, largest first; the bytes
    are the plan's (`peak_holders`: on-chip memory and the heap's packing counted as the plan counts them)."""
    rows = []
    for total in totals:
        named = [describe(module, h) for h in holders if h.kind == total.kind][:TOP]
        rows.append((KIND_NAMES.get(total.kind, total.kind), total.per_device_bytes, named))
    return rows


__all__ = ["KIND_NAMES", "holder_name", "maxtext_holders"]
