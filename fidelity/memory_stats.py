"""A compiled step's memory statistics as the references record them: XLA's fields, bytes per device."""

from __future__ import annotations

from typing import Any

MEMORY_FIELDS = (
    "argument_size_in_bytes",
    "output_size_in_bytes",
    "temp_size_in_bytes",
    "alias_size_in_bytes",
    "generated_code_size_in_bytes",
)


def memory_record(stats: Any) -> dict[str, int]:
    """`compiled.memory_analysis()` as a dict, with `total_bytes` = argument + output + temp - alias."""
    memory = {k: int(getattr(stats, k)) for k in MEMORY_FIELDS}
    memory["total_bytes"] = (
        memory["argument_size_in_bytes"]
        + memory["output_size_in_bytes"]
        + memory["temp_size_in_bytes"]
        - memory["alias_size_in_bytes"]
    )
    return memory
