"""Real XLA for the benchmarks: jaxlib's SPMD compile of HLO text on virtual CPU devices.

Import this module before anything imports jax: it sets the device count.
"""

from __future__ import annotations

import os

PARTITIONS = 8
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={PARTITIONS}"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from planner.plan.compilers import xla_compile  # noqa: E402


def compile_spmd(text: str, allow_output: bool = False, partitions: int = PARTITIONS) -> tuple[object, float]:
    """(executable, seconds): jaxlib's SPMD compile of `text` (see `planner.plan.compilers.xla_compile`)."""
    return xla_compile.compile_spmd(text, partitions, allow_output)


memory_total = xla_compile.memory_total


def summary(benchmark: str, case: str, ours: float, xla: float, unit: str, ratio: float, note: str = "") -> None:
    """One headline row, printed as `SUMMARY {json}` for bench/all.py to collect."""
    import json

    row = {"benchmark": benchmark, "case": case, "ours": ours, "xla": xla, "unit": unit, "ratio": ratio, "note": note}
    print("SUMMARY " + json.dumps(row))
