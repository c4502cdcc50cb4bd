"""Propagation speed: this simulator against XLA's own compile of the same module.

    .venv/bin/python bench/propagation.py [FILE.hlo ...] [--repeat N]

For each file: our parse + call inlining + propagation (median of N), and
XLA's SPMD compile on 8 virtual CPU devices through jaxlib (median of 2:
text -> HloModule -> StableHLO -> compile), side by side with the ratio.
XLA's compile does more than propagate (it partitions and optimises); that is
the cost a user pays today to learn the same shardings.
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

from planner import clear_caches  # noqa: E402
from planner.hlo.text.compat import for_jaxlib_0_7  # noqa: E402
from planner.hlo.text.parser import parse_hlo  # noqa: E402
from planner.prepare import prepare  # noqa: E402
from planner.propagation import propagate  # noqa: E402

SHARED = Path(os.environ.get("SPMD_SHARED_DIR", REPO.parent / "shared"))
DEFAULT = [
    SHARED / "corpus" / "torch_xla" / "llama_scan_L8_fsdp4_tp2.hlo",
    SHARED / "corpus" / "jax" / "jax_llama_scan_L8_fsdp4_tp2.hlo",
]


def ours_seconds(text: str) -> float:
    clear_caches()  # each run starts cold, as a fresh request would
    start = time.perf_counter()
    propagate(prepare(parse_hlo(text)))
    return time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", type=Path, default=DEFAULT)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    print(f"{'file':<40} {'ours s':>8} {'XLA compile s':>14} {'ours/XLA':>9}")
    for path in args.files:
        text = for_jaxlib_0_7(path.read_text())
        ours = statistics.median(ours_seconds(text) for _ in range(args.repeat))
        xla = statistics.median(compile_spmd(text)[1] for _ in range(2))
        print(f"{path.name:<40} {ours:>8.3f} {xla:>14.3f} {ours / xla:>9.3f}")
        summary("propagate (parse + inline + propagate)", path.name, ours, xla, "s", ours / xla, "vs XLA's compile")
    return 0


if __name__ == "__main__":
    sys.exit(main())
