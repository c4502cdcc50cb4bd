"""Plan time against module size: every corpus file, smallest to largest, next to XLA's compile of it.

    .venv/bin/python bench/plan_scaling.py [--sample N]

One cold plan per file (no mesh given: the module's own partition count; `--sample N`: N files
spread evenly from the smallest to the largest),
and one jaxlib SPMD compile of the same text. Prints size, instructions,
plan seconds, XLA seconds and their ratio, and microseconds of planning per
instruction, to show how planning grows with the module.
"""

from __future__ import annotations

import argparse
import os
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
from planner.plan.planner import make_plan  # noqa: E402
from planner.prepare import prepare  # noqa: E402

SHARED = Path(os.environ.get("SPMD_SHARED_DIR", REPO.parent / "shared"))


def spread(files: list[Path], count: int | None) -> list[Path]:
    """`count` of the size-ordered files, the smallest and the largest always among them."""
    if count is None or count >= len(files):
        return files
    if count <= 1:
        return files[-1:]
    return [files[round(i * (len(files) - 1) / (count - 1))] for i in range(count)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sample", type=int, metavar="N", help="only N files, spread over the sizes")
    args = ap.parse_args()
    files = spread(sorted((SHARED / "corpus").glob("*/*.hlo"), key=lambda p: p.stat().st_size), args.sample)
    print(f"{'file':<46} {'KB':>6} {'instrs':>7} {'plan s':>7} {'XLA s':>7} {'plan/XLA':>9} {'us/instr':>9}")
    for path in files:
        text = for_jaxlib_0_7(path.read_text())
        clear_caches()
        start = time.perf_counter()
        module = parse_hlo(text)
        make_plan(prepare(module))
        ours = time.perf_counter() - start
        xla = compile_spmd(text, allow_output=True)[1]
        count = module.num_instructions
        print(f"{path.name:<46} {len(text) / 1e3:>6.0f} {count:>7} {ours:>7.2f} {xla:>7.2f} {ours / xla:>9.2f} "
              f"{ours / count * 1e6:>9.0f}")  # fmt: skip
        summary("plan vs module size", f"{path.name} ({len(text) / 1e3:.0f} KB)", ours, xla, "s", ours / xla)
    return 0


if __name__ == "__main__":
    sys.exit(main())
