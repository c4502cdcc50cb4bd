"""Full plan time against XLA's compile of the same module.

    .venv/bin/python bench/plan.py [FILE.hlo ...] [--repeat N]

For each file: our whole plan without verification (parse, inline, propagate,
size memory, find, root-cause, build placements, re-simulate each; median of
N, cold caches), XLA's SPMD compile of the same text on 8 virtual CPU devices
through jaxlib (median of 2), their ratio, and the share of the plan spent
in re-simulation. The target for the bundled L=8 dump is a plan under 5% of
XLA's compile.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from xla_reference import compile_spmd, summary  # noqa: E402

from planner.hlo.compat import for_jaxlib_0_7  # noqa: E402
from planner.hlo.parser import parse_hlo  # noqa: E402
from planner.mesh import Mesh  # noqa: E402
from planner.plan import planner as planner_module  # noqa: E402
from planner.sharding import clear_caches  # noqa: E402

SHARED = Path(os.environ.get("SPMD_SHARED_DIR", REPO.parent / "shared"))
DEFAULT = [
    SHARED / "corpus" / "torch_xla" / "llama_scan_L8_fsdp4_tp2.hlo",
    SHARED / "corpus" / "jax" / "jax_llama_scan_L8_fsdp4_tp2.hlo",
]
TARGET = 0.05


def plan_seconds(text: str, mesh: Mesh) -> tuple[float, int]:
    """(seconds, simulations run) for one cold plan."""
    clear_caches()
    count = 0
    simulate = planner_module.simulate

    def counting(*args: object, **kwargs: object) -> planner_module.Simulation:
        nonlocal count
        count += 1
        return simulate(*args, **kwargs)  # type: ignore[arg-type]

    planner_module.simulate = counting  # type: ignore[assignment]
    try:
        start = time.perf_counter()
        planner_module.make_plan(parse_hlo(text), mesh)
        return time.perf_counter() - start, count
    finally:
        planner_module.simulate = simulate  # type: ignore[assignment]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", type=Path, default=DEFAULT)
    ap.add_argument("--mesh", default="fsdp=4,tp=2")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    mesh = Mesh.parse(args.mesh)
    print(f"{'file':<40} {'plan s':>8} {'simulations':>12} {'XLA compile s':>14} {'plan/XLA':>9} {'target':>7}")
    for path in args.files:
        text = for_jaxlib_0_7(path.read_text())
        runs = [plan_seconds(text, mesh) for _ in range(args.repeat)]
        ours = statistics.median(r[0] for r in runs)
        xla = statistics.median(compile_spmd(text, allow_output=True)[1] for _ in range(2))
        verdict = "met" if ours / xla <= TARGET else "missed"
        print(f"{path.name:<40} {ours:>8.3f} {runs[0][1]:>12} {xla:>14.3f} {ours / xla:>9.3f} {verdict:>7}")
        summary("full plan", path.name, ours, xla, "s", ours / xla, f"target <= {TARGET}: {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
