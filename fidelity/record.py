"""Writing one case's fixture pair, NAME.hlo and NAME.xla.json, and the facts both runners record."""

from __future__ import annotations

import json
import resource
import sys
from pathlib import Path
from typing import Any

from fidelity.cases import Case


def mesh_record(case: Case) -> dict[str, Any]:
    # Devices are laid out in id order: device (i, j) of the mesh is id i * shape[1] + j.
    return {
        "shape": list(case.mesh.shape),
        "axis_names": list(case.mesh.axis_names),
        "device_ids": list(range(case.mesh.num_devices)),
    }


def count_opcode(hlo_text: str, opcode: str) -> int:
    """Instructions with this opcode; `= SHAPE opcode(` is how both the short and the long form print them."""
    return sum(1 for line in hlo_text.splitlines() if " = " in line and f" {opcode}(" in line.split(" = ", 1)[1])


def process_maxrss_bytes() -> int:
    # Linux reports ru_maxrss in KiB.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def write_fixture(out_dir: Path, name: str, hlo_text: str, record: dict[str, Any]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{name}.hlo").write_text(hlo_text)
    (out_dir / f"{name}.xla.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {out_dir / name}.hlo ({len(hlo_text):,} chars) and {name}.xla.json", file=sys.stderr)
