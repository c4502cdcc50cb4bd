"""A compiled step's memory as the references record them: XLA's statistics, bytes per device, and for
XLA:TPU the HBM its buffer assignment holds (`hbm_bytes`, read by
`planner.plan.compilers.xla_compile.hbm_allocated_bytes`).

XLA:TPU's statistics are not its HBM: `temp_size` adds the on-chip VMEM (memory space 1) and bytes no
allocation of the buffer assignment accounts for (0.1 to 2.9 GiB on MaxText's steps). The allocations
buffer assignment makes in the default memory space (color 0) are every byte in HBM, the parameters' beside
the temporaries' heap; their total is the memory-usage report's for that space in today's libtpu (equal to
the byte on MaxText's steps) and the number XLA:TPU checks against the chip: the two steps of MaxText's it
refuses quote exactly that total in their out-of-memory error.

A step XLA:TPU refuses is recorded with that error read (`hbm_oom`, in both of libtpu's spellings) by every
runner; `reference_bytes` is what a record says XLA:TPU holds or needs, and `compared_bytes` ours as it counts.
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


_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_SIZE = r"([\d.]+)([KMGT])"
# libtpu's two spellings of one total (`Used 42.79G of 31.24G hbm`; `the total memory required for HLO
# temporaries (36.62G) exceeds available HBM (31.24G)`, which counts the parameters' allocations too).
_USED = re.compile(rf"Used {_SIZE} of {_SIZE} hbm")
_TEMPORARIES = re.compile(rf"required for HLO temporaries \({_SIZE}\) exceeds available HBM \({_SIZE}\)")


def _bytes(number: str, unit: str) -> int:
    return round(float(number) * _UNITS[unit])


def hbm_oom(message: str) -> dict[str, Any] | None:
    """XLA:TPU's compile-time HBM out-of-memory error, read (its units are binary): the HBM per chip it says
    the step needs (`needed_bytes`, in either spelling) and what is available; None for any other error."""
    line = next((ln.strip() for ln in message.splitlines() if "HBM" in ln or "hbm" in ln), message.strip())[:500]
    found = _USED.search(message) or _TEMPORARIES.search(message)
    if found is None:
        return None
    groups = found.groups()
    return {"message": line, "needed_bytes": _bytes(*groups[:2]), "available_bytes": _bytes(*groups[2:])}


def reference_bytes(record: dict[str, Any]) -> tuple[int, bool]:
    """What XLA:TPU holds per chip in HBM for a recorded step, and whether it compiled the step.

    Its buffer assignment's HBM total where the report was kept; else, for a refused step, the total its
    out-of-memory error quotes (the same number), and for a compiled one its memory statistics' total."""
    tpu = record["tpu"]
    compiled = "memory" in tpu
    if "hbm_bytes" in tpu:
        return int(tpu["hbm_bytes"]), compiled
    if compiled:
        return int(tpu["memory"]["total_bytes"]), True
    return int(tpu["oom"]["needed_bytes"]), False


def compared_bytes(report: Any, compiled: bool) -> int:
    """Our bytes per chip (a `planner.memory.MemoryReport`) as `reference_bytes` counts XLA:TPU's: a step it
    refuses is quoted before its heap is packed (the 405B step's refused buffer assignment holds a heap exactly
    its live peak, under both partitioners), so the heap's packing is left out of ours too."""
    from planner.memory.report import HEAP_PACKING

    return int(report.total_bytes) - (0 if compiled else int(report.breakdown.get(HEAP_PACKING, 0)))
