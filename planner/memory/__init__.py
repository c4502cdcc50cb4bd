"""Per-device memory: buffers, liveness, HBM per chip."""

from planner.memory.chips import CHIPS, Chip, chip, parse_byte_count, parse_bytes
from planner.memory.estimation import MemoryEstimation, estimate_memory, memory_timeline
from planner.memory.model import MemoryEstimate
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
    "memory_timeline",
    "parse_byte_count",
    "parse_bytes",
    "render_memory",
]
