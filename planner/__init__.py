"""SPMD sharding planner: read HLO, simulate GSPMD, size HBM per chip, plan fixes."""

from planner.errors import HloParseError, PlannerError, PlanningError, UnsupportedHlo
from planner.hlo.ir import Computation, HloModule, Instruction
from planner.hlo.loops import WhileLoop, while_loops
from planner.hlo.parser import parse_hlo, parse_hlo_file
from planner.hlo.printer import print_module
from planner.sharding import HloSharding, TileAssignment, parse_sharding

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
