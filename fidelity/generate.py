"""Generate reference fixtures: NAME.hlo and NAME.xla.json for the committed cases (or any case with --only).

    python -m fidelity.generate --out tests/fixtures/generated [--only NAME ...] [--dumps DIR]

Each case runs in a subprocess of its own front end's runner: XLA's flags, the device count and
torch_xla's runtime are fixed when a process first imports jax or torch_xla, and the two front ends
must not share a process.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from fidelity.cases import FIXTURE_CASES, Case, case_named
from fidelity.memory_stats import reference_bytes
from fidelity.record import runner_environment

RUNNERS = {"jax": "fidelity.run_jax", "torch_xla": "fidelity.run_torch_xla"}
# A torch_xla step of a transformers model (`Case.transformers_model`) has a runner of its own.
TRANSFORMERS_RUNNER = "fidelity.run_transformers"
_LEAF = re.compile(r"[a-z][a-z0-9]*\[[0-9,]*\]")
PROJECT_ROOT = Path(__file__).resolve().parents[1]


def run_case(case: Case, out_dir: Path, dumps: Path | None, runner_args: tuple[str, ...] = ()) -> bool:
    runner = TRANSFORMERS_RUNNER if case.transformers_model else RUNNERS[case.front_end]
    cmd = [sys.executable, "-m", runner, case.name, "--out", str(out_dir), *runner_args]
    if dumps is not None:
        cmd += ["--dumps", str(dumps / case.name)]
    env = runner_environment(os.environ)
    # The package is not installed: the child finds it through the project root.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH")) if p)
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=env, cwd=PROJECT_ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        print(f"FAILED {case.name} ({seconds:.1f} s):\n{done.stderr[-4000:]}", file=sys.stderr)
        return False
    print(summary(out_dir / f"{case.name}.xla.json", seconds))
    return True


def _arities(whiles: list[dict[str, str]]) -> str:
    """Elements per While tuple after partitioning, e.g. `44/49`."""
    return "/".join(str(len(_LEAF.findall(w["shape"]))) for w in whiles) or "none"


def summary(record_path: Path, seconds: float) -> str:
    """One line per case: each compiler's bytes per device and While arities, compile times."""
    record = json.loads(record_path.read_text())
    total = record.get("memory", {}).get("total_bytes", record.get("xla_per_device_total_bytes", 0))
    whiles = record.get("post_partition_while_shapes") or record.get("xla_post_partition_while_shapes") or []
    line = f"{record['name']}: XLA:CPU {total / 2**20:,.1f} MiB per device, Whiles {_arities(whiles)}"
    if tpu := record.get("tpu"):
        needed, compiled = reference_bytes(record)
        held = f"{needed / 2**20:,.1f} MiB" if compiled else f"refuses it, needs {needed / 2**20:,.1f} MiB"
        line += (
            f"; XLA:TPU {held}, Whiles "
            f"{_arities(tpu.get('post_partition_while_shapes', []))}, compile {tpu['compile_seconds']:.1f} s"
        )
    return (
        f"{line}; XLA:CPU compile {record['compile_seconds']:.1f} s, opt-barrier x{record['opt_barrier_count']}, "
        f"{seconds:.1f} s in all"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="directory for NAME.hlo and NAME.xla.json")
    ap.add_argument("--only", action="append", metavar="NAME", help="run only this case (repeatable)")
    ap.add_argument("--dumps", type=Path, help="keep each case's XLA dump in DIR/NAME")
    args = ap.parse_args(argv)
    # The grid's cases live in the sweep's content-keyed cache (`fidelity.sweep`); by default this
    # writes the committed fixtures of tests/fixtures/generated.
    cases = [case_named(n) for n in args.only] if args.only else list(FIXTURE_CASES)
    out_dir = args.out.resolve()
    dumps = args.dumps.resolve() if args.dumps else None
    failed = [c.name for c in cases if not run_case(c, out_dir, dumps)]
    if failed:
        print(f"{len(failed)} of {len(cases)} cases failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
