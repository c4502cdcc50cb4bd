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
    "clear_caches",
    "estimate_memory",
    "memory_report",
    "memory_timeline",
    "parse_byte_count",
    "parse_bytes",
    "render_memory",
]


def clear_caches() -> None:
    """Forgets what the memory model memoises across calls: each sharding's device groups per dim, and the
    sweep's measured error bands and reference steps read from disk."""
    from planner.memory import dot_partition, report

    for cached in (dot_partition.axis_grouping, report.signed_error, report.error_band, report.reference_steps):
        cached.cache_clear()
