"""A compiled step's memory as the references record them: XLA's statistics, bytes per device, and for
XLA:TPU the HBM its buffer assignment holds (`hbm_bytes`, read by
`planner.plan.compilers.xla_compile.hbm_allocated_bytes`).

XLA:TPU's statistics are not its HBM: `temp_size` adds the on-chip VMEM (memory space 1) and bytes no
allocation of the buffer assignment accounts for (0.1 to 2.9 GiB on MaxText's steps). The allocations
buffer assignment makes in the default memory space (color 0) are every byte in HBM, the parameters' beside
the temporaries' heap; their total is the memory-usage report's for that space in today's libtpu (equal to
the byte on MaxText's steps) and the number XLA:TPU checks against the chip: the two steps of MaxText's it
refuses quote exactly that total in their out-of-memory error.
"""

from __future__ import annotations

import re
from typing import Any

MEMORY_FIELDS = (
    "argument_size_in_bytes",
    "output_size_in_bytes",
    "temp_size_in_bytes",
    "alias_size_in_bytes",
    "generated_code_size_in_bytes",
)
# Host memory (host offload): what XLA:TPU's buffer assignment places in host memory space 5.
HOST_FIELDS = ("host_argument_size_in_bytes", "host_output_size_in_bytes", "host_temp_size_in_bytes")


def memory_record(stats: Any) -> dict[str, int]:
    """`compiled.memory_analysis()` as a dict, with `total_bytes` = argument + output + temp - alias."""
    memory = {k: int(getattr(stats, k)) for k in MEMORY_FIELDS}
    memory.update({k: int(getattr(stats, k, 0) or 0) for k in HOST_FIELDS})
    memory["total_bytes"] = (
        memory["argument_size_in_bytes"]
        + memory["output_size_in_bytes"]
        + memory["temp_size_in_bytes"]
        - memory["alias_size_in_bytes"]
    )
    return memory


_REPORT_HBM_TOTAL = re.compile(r"^Memory Space: default \(color=0\)\s*\nTotal bytes: (\d+)", re.MULTILINE)


def report_hbm_bytes(report: str) -> int | None:
    """The same total as today's libtpu writes it in its memory-usage report (older ones total every space)."""
    found = _REPORT_HBM_TOTAL.search(report)
    return int(found.group(1)) if found else None
