"""Writing one case's fixture pair, NAME.hlo and NAME.xla.json, and the facts both runners record."""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fidelity.cases import Case, case_named

# Variables that steer how the front ends lower and the compilers compile (JAX_ENABLE_X64,
# LIBTPU_INIT_ARGS, XLA_FLAGS, ...): a reference is made without them, whatever the caller's shell holds.
_STEERING_PREFIXES = ("JAX_", "XLA_", "LIBTPU_", "TPU_", "PJRT_", "CPU_NUM_DEVICES", "ALLOW_MULTIPLE_LIBTPU_LOAD")


def runner_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment a runner starts from: the caller's, less what would change the record."""
    return {k: v for k, v in environ.items() if not k.startswith(_STEERING_PREFIXES)}


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


@dataclass(frozen=True)
class RunOptions:
    """How a runner compiles and dumps, beyond the case: the experiment knobs and what it writes."""

    # Passes (or whole pipelines) XLA skips, by name: every compiler in the process honours the flag,
    # XLA:CPU as well as libtpu's XLA:TPU. For experiments; cached references never set it.
    disabled_passes: tuple[str, ...] = ()
    dump_all: bool = False  # every pass boundary of every pipeline (~1,600 files for one XLA:TPU compile)
    # Also write NAME.tpu_pre_propagation.hlo (XLA:TPU's module entering propagation) beside NAME.hlo.
    tpu_pre_propagation: bool = False

    def experiment(self) -> dict[str, Any] | None:
        """What a record notes when it was not made the way references are."""
        if not self.disabled_passes and not self.dump_all:
            return None
        return {"disabled_passes": list(self.disabled_passes), "dump_all": self.dump_all}


def runner_main(
    argv: list[str] | None,
    description: str,
    front_end: str,
    set_environment: Callable[[Case, Path, RunOptions], None],
    run: Callable[[Case, Path, Path, RunOptions], None],
) -> int:
    """A front end's runner: `NAME --out DIR [--dumps DIR] [--disable-passes a,b] [--dump-all]`, one case here.

    The environment (device count, XLA_FLAGS with the dump directory) is set before the front end is
    imported, which is why each case gets a process of its own.
    """
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("name")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--dumps", type=Path, help="keep XLA's dump here (default: a temporary directory)")
    ap.add_argument(
        "--disable-passes",
        metavar="A,B,C",
        default="",
        help="experiment: --xla_disable_hlo_passes=A,B,C (pass or pipeline names). XLA reads its flags once "
        "per process, so this applies to every compile here: the XLA:CPU compile as well as the XLA:TPU one",
    )
    ap.add_argument(
        "--dump-all",
        action="store_true",
        help="experiment: dump every pass boundary of every pipeline (--xla_dump_hlo_pass_re=.+), for reading "
        "a pipeline pass by pass; XLA:TPU writes ~1,600 files per compile. Use with --dumps",
    )
    ap.add_argument(
        "--tpu-pre-propagation",
        action="store_true",
        help="also write NAME.tpu_pre_propagation.hlo, XLA:TPU's module as it enters propagation (the "
        "reference cache keeps it; committed fixtures do not)",
    )
    args = ap.parse_args(argv)
    case = case_named(args.name)
    if case.front_end != front_end:
        raise ValueError(f"{case.name} is a {case.front_end} case, not a {front_end} one")
    if front_end in sys.modules:
        raise RuntimeError(f"{front_end} was imported before its environment was set")
    options = RunOptions(tuple(p for p in args.disable_passes.split(",") if p), args.dump_all, args.tpu_pre_propagation)
    dump_dir = args.dumps or Path(tempfile.mkdtemp(prefix=f"fidelity-{case.name}-"))
    set_environment(case, dump_dir, options)
    try:
        run(case, args.out, dump_dir, options)
    finally:
        if args.dumps is None:
            shutil.rmtree(dump_dir, ignore_errors=True)
    return 0
