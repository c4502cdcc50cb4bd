"""SPMD sharding planner: read HLO, simulate GSPMD, size HBM per chip, plan fixes."""

from planner import native

# Before any compiled module loads: the compiled core, or the source when it is missing or stale.
native.select()

from planner.errors import HloParseError, PlannerError, PlanningError, UnsupportedHlo  # noqa: E402
from planner.hlo.ir import Computation, HloModule, Instruction  # noqa: E402
from planner.hlo.loops import WhileLoop, while_loops  # noqa: E402
from planner.hlo.parser import parse_hlo, parse_hlo_file  # noqa: E402
from planner.hlo.printer import print_module  # noqa: E402
from planner.sharding import HloSharding, TileAssignment, parse_sharding  # noqa: E402

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
    "parse_hlo",
    "parse_hlo_file",
    "parse_sharding",
    "print_module",
    "while_loops",
]
