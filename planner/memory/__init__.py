"""Per-device memory: buffers, liveness, HBM per chip."""

from planner.memory.chips import CHIPS, Chip, chip, parse_bytes
from planner.memory.model import MemoryEstimate, MemoryEstimation, estimate_memory
from planner.memory.report import MemoryReport, memory_report, render_memory

__all__ = [
    "CHIPS",
    "Chip",
    "MemoryEstimate",
    "MemoryEstimation",
    "MemoryReport",
    "chip",
    "estimate_memory",
    "memory_report",
    "parse_bytes",
    "render_memory",
]
