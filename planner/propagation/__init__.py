"""Sharding propagation, simulated, with the reason for every decision: two engines over one graph.

- `gspmd/`: XLA's ShardingPropagation pass (GSPMD), rule by rule.
- `shardy/`: Shardy's propagation (JAX's default partitioner), by its own op sharding rules and strategies.
- `shared/`: what both build on and hand on: the working graph with its provenance, dot dimension roles, and
  the result every later stage reads.

`propagate` runs the engine of the partitioner the prepared module names. Neither engine imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from planner.gc_pause import collection_paused
from planner.prepare.propagation_options import PropagationOptions
from planner.propagation.gspmd import run_gspmd
from planner.propagation.shared.dot_dims import DotDims, dot_dims
from planner.propagation.shared.result import ExplainStep, PropagatedInstruction, PropagationResult

if TYPE_CHECKING:
    from planner.prepare import PreparedModule


@dataclass(frozen=True)
class ShardingPropagation:
    """The propagation pass as a value (see `planner.passes`): its options are its fields."""

    options: PropagationOptions | None = None  # None: the prepared module's, as XLA's compile takes them

    def apply(self, prepared: PreparedModule) -> PropagationResult:
        return propagate(prepared, self.options)


def propagate(prepared: PreparedModule, options: PropagationOptions | None = None) -> PropagationResult:
    """Runs propagation on the module the prepared module's compiler partitions (`planner.prepare`).

    `options` replace the prepared module's (the shard-group check runs without groups).
    """
    if prepared.shardy is not None:
        from planner.propagation.shardy import shardy_decisions
        from planner.propagation.shardy.result import propagation_result

        with collection_paused():
            return propagation_result(prepared.module, shardy_decisions(prepared.shardy), prepared.aliases)
    with collection_paused():
        return run_gspmd(prepared.module, options if options is not None else prepared.options, prepared.aliases)


def clear_caches() -> None:
    """Forgets what propagation memoises across calls: which Shardy the installed jaxlib carries."""
    from planner.propagation.shardy import release

    release.clear_caches()


__all__ = [
    "DotDims",
    "ExplainStep",
    "PropagatedInstruction",
    "PropagationOptions",
    "PropagationResult",
    "ShardingPropagation",
    "clear_caches",
    "dot_dims",
    "propagate",
]
