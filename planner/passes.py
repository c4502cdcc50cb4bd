"""The planner's passes, registered by name: each a frozen value whose fields are its options.

    Preparation(target, mesh).apply(module)               -> PreparedModule (the target compiler's view)
    ShardingPropagation(options).apply(prepared)          -> PropagationResult
    MemoryEstimation().apply(prepared, result)            -> MemoryEstimate
    Planning(capacity_bytes, ...).apply(prepared)         -> (Plan, patched module)

The planner composes them (`make_plan` runs propagation and memory estimation once for the prepared
module and once per candidate placement, re-preparing the patched module); the CLI, the service and
the client call the same values.
"""

from __future__ import annotations

from planner.memory.estimation import MemoryEstimation
from planner.plan.planner import Planning
from planner.prepare import Preparation
from planner.propagation import ShardingPropagation

PASSES: dict[str, type[Preparation] | type[ShardingPropagation] | type[MemoryEstimation] | type[Planning]] = {
    "prepare": Preparation,
    "sharding-propagation": ShardingPropagation,
    "memory-estimation": MemoryEstimation,
    "planning": Planning,
}

__all__ = ["PASSES", "MemoryEstimation", "Planning", "Preparation", "ShardingPropagation"]
