"""The memory pass over a prepared module: its target compiler's bytes, and the same bytes over time.

The model itself (`model.estimate_module`, `timeline.timelines`) works on the module propagation
saw; these are the planner's way in, so the module, mesh and target always come from one
`PreparedModule` and cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.memory.model import MemoryEstimate, estimate_module
from planner.memory.timeline import Timeline, timelines
from planner.prepare import PreparedModule
from planner.propagation import PropagationResult


@dataclass(frozen=True)
class MemoryEstimation:
    """The memory pass as a value (see `planner.passes`): per-device bytes of a propagated prepared module."""

    def apply(self, prepared: PreparedModule, result: PropagationResult) -> MemoryEstimate:
        return estimate_memory(prepared, result)


def estimate_memory(prepared: PreparedModule, result: PropagationResult) -> MemoryEstimate:
    """Per-device bytes for the prepared module's target, `result` being `propagate(prepared)`'s."""
    return estimate_module(prepared.module, result, prepared.mesh, prepared.target)


def memory_timeline(
    prepared: PreparedModule, result: PropagationResult, estimate: MemoryEstimate | None = None
) -> list[Timeline]:
    """The entry's timeline, then one per While body, nested ones too (`estimate` when already made)."""
    estimate = estimate if estimate is not None else estimate_memory(prepared, result)
    return timelines(prepared.module, result, estimate, prepared.target)
