"""Writing one case's fixture pair, NAME.hlo and NAME.xla.json, and the facts both runners record."""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fidelity.cases import Case, case_named


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


def runner_main(
    argv: list[str] | None,
    description: str,
    front_end: str,
    set_environment: Callable[[Case, Path], None],
    run: Callable[[Case, Path, Path], None],
) -> int:
    """A front end's runner: `NAME --out DIR [--dumps DIR]`, one case in this process.

    The environment (device count, XLA_FLAGS with the dump directory) is set before the front end is
    imported, which is why each case gets a process of its own.
    """
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("name")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--dumps", type=Path, help="keep XLA's dump here (default: a temporary directory)")
    args = ap.parse_args(argv)
    case = case_named(args.name)
    if case.front_end != front_end:
        raise ValueError(f"{case.name} is a {case.front_end} case, not a {front_end} one")
    if front_end in sys.modules:
        raise RuntimeError(f"{front_end} was imported before its environment was set")
    dump_dir = args.dumps or Path(tempfile.mkdtemp(prefix=f"fidelity-{case.name}-"))
    set_environment(case, dump_dir)
    try:
        run(case, args.out, dump_dir)
    finally:
        if args.dumps is None:
            shutil.rmtree(dump_dir, ignore_errors=True)
    return 0
