"""SPMD sharding planner: read HLO, simulate GSPMD and Shardy, size HBM per chip, plan fixes.

The engine, in layers (each imports only those below it; `make lint` checks the contract in pyproject.toml):
- `search/`: which configuration of a JAX step fits, planned and ranked on Ray.
- `wire`: the schema of what crosses the wire between the clients and the service.
- `passes`: the pipeline as values (prepare, propagate, size, plan).
- `plan/`: findings, placements, verification.
- `memory/`: the per-device memory model.
- `propagation/`: the GSPMD and Shardy engines over one graph.
- `prepare/`: each compiler's passes before propagation.
- `hlo/`: the IR, its text forms, shape inference, loops.
- `sharding/`: the sharding algebra.
"""

from planner import native

# Before any compiled module loads: the compiled core, or the source when it is missing or stale.
native.select()

from planner.errors import HloParseError, PlannerError, PlanningError, UnsupportedHlo  # noqa: E402
from planner.hlo.ir.module import Computation, HloModule, Instruction  # noqa: E402
from planner.hlo.structure.loops import WhileLoop, while_loops  # noqa: E402
from planner.hlo.text.parser import parse_hlo, parse_hlo_file  # noqa: E402
from planner.hlo.text.printer import print_module  # noqa: E402
from planner.sharding import HloSharding, TileAssignment, parse_sharding  # noqa: E402


def clear_caches() -> None:
    """Forgets what every package memoises across calls, so that a benchmark's run starts cold."""
    from planner import hlo, memory, plan, propagation, sharding

    sharding.clear_caches()
    hlo.clear_caches()
    propagation.clear_caches()
    memory.clear_caches()
    plan.clear_caches()


__all__ = [
    "Computation",
    "HloModule",
    "HloParseError",
    "HloSharding",
    "Instruction",
    "PlannerError",
    "PlanningError",
    "TileAssignment",
    "UnsupportedHlo",
    "WhileLoop",
    "clear_caches",
    "parse_hlo",
    "parse_hlo_file",
    "parse_sharding",
    "print_module",
    "while_loops",
]
