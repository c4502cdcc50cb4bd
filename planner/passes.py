"""The planner's passes, registered by name: each a frozen value whose fields are its options.

    ShardingPropagation(options).apply(module)          -> PropagationResult
    MemoryEstimation(mesh, target).apply(module, result) -> MemoryEstimate (module inlined, as propagated)
    Planning(mesh, capacity_bytes, ...).apply(module)    -> (Plan, patched module)

The planner composes them (`make_plan` runs propagation and memory estimation once for the module
and once per candidate placement); the CLI and the service call the same values.
"""

from __future__ import annotations

from planner.memory.model import MemoryEstimation
from planner.plan.planner import Planning
from planner.propagation import ShardingPropagation

PASSES: dict[str, type[ShardingPropagation] | type[MemoryEstimation] | type[Planning]] = {
    "sharding-propagation": ShardingPropagation,
    "memory-estimation": MemoryEstimation,
    "planning": Planning,
}

__all__ = ["PASSES", "MemoryEstimation", "Planning", "ShardingPropagation"]
