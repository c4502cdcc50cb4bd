"""XLA:TPU's numbers for a torch_xla reference: its dumped step compiled ahead of time for the case's slice.

torch_xla runs its step on the CPU devices; XLA:TPU reads modules only through jaxlib's StableHLO
path, which the planner's faithful conversion (`planner.plan.compilers.stablehlo`) makes give XLA the module
torch_xla's own XLA sees. The compile runs in a child of its own (`compile_with_xla`), away from
the torch_xla runtime and its XLA flags, after the torch_xla runner has written the record.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from fidelity.cases import Case

# What the XLA:TPU part of a torch_xla reference is made from, besides the runner's own sources.
SOURCES = ("fidelity/torch_xla_tpu.py", "planner/plan/compilers/xla_compile.py", "planner/plan/compilers/stablehlo.py",
           "planner/plan/compilers/round_trip.py", "planner/hlo/structure/seal.py")  # fmt: skip


def add_tpu_record(case: Case, hlo: Path) -> None:
    """Compiles NAME.hlo for the case's TPU slice and writes XLA:TPU's bytes and While shapes into NAME.xla.json."""
    from planner.plan.compilers.verify import compile_with_xla

    assert case.tpu_topology is not None, f"{case.name} names no TPU chip"
    t0 = time.perf_counter()
    report = compile_with_xla(hlo.read_text(), case.mesh.num_devices, True, tpu_topology=case.tpu_topology)
    tpu: dict[str, Any] = {
        "topology": case.tpu_topology,
        "num_devices": case.mesh.num_devices,
        "compiler": report["xla"],
        "compile_seconds": round(time.perf_counter() - t0, 3),
        "memory": {
            "argument_size_in_bytes": report["argument_bytes"],
            "output_size_in_bytes": report["output_bytes"],
            "temp_size_in_bytes": report["temp_bytes"],
            "alias_size_in_bytes": report["alias_bytes"],
            "total_bytes": report["argument_bytes"]
            + report["output_bytes"]
            + report["temp_bytes"]
            - report["alias_bytes"],
        },
        "post_partition_while_shapes": report["while_shapes"],
    }
    if report.get("hbm_bytes") is not None:
        tpu["hbm_bytes"] = report["hbm_bytes"]
    path = hlo.with_suffix(".xla.json")
    record = json.loads(path.read_text())
    record["tpu"] = tpu
    path.write_text(json.dumps(record, indent=1) + "\n")
