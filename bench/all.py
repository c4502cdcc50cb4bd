"""Every benchmark, one after the other, and one table of their headline ratios.

    .venv/bin/python bench/all.py [--quick]

Each benchmark runs in its own process (XLA reads its device flags once per
process) and prints its own detailed table; their `SUMMARY` lines are
collected into the closing table. Ratios are ours / XLA unless the row's note
says otherwise. The fuzz run (`fuzz_surfaces.py`) has no XLA to compare with: it
prints its count of tracebacks and 5xx answers, which must be 0. `--quick` runs fewer repetitions and
fuzz inputs, leaves out the 405B-shaped step and sizes plan time against five corpus files, not all.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
SCRIPTS = [
    ("parse.py", ["--repeat", "7"], ["--repeat", "2"]),
    ("propagation.py", ["--repeat", "5"], ["--repeat", "1"]),
    # Quick: the 8-device steps only, and plan time against size on five files instead of every one
    # (`plan_scaling.py` covers what `plan.py`'s per-MB table does).
    ("plan.py", ["--repeat", "3"], ["--repeat", "1", "--no-405b", "--no-per-mb"]),
    ("memory.py", [], []),
    ("plan_scaling.py", [], ["--sample", "5"]),
    ("service.py", ["--uncached", "5", "--cached", "20"], ["--uncached", "2", "--cached", "5"]),
    ("fuzz_surfaces.py", ["--inputs", "10000"], ["--inputs", "400"]),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    rows = []
    for script, full, quick in SCRIPTS:
        print(f"\n=== {script} " + "=" * (60 - len(script)), flush=True)
        start = time.perf_counter()
        done = subprocess.run([sys.executable, str(BENCH / script), *(quick if args.quick else full)],
                              capture_output=True, text=True, check=False)  # fmt: skip
        for line in done.stdout.splitlines():
            if line.startswith("SUMMARY "):
                rows.append(json.loads(line.removeprefix("SUMMARY ")))
            else:
                print(line)
        if done.returncode != 0:
            print(done.stderr[-2000:])
            return done.returncode
        print(f"({time.perf_counter() - start:.0f} s)")
    print(f"\n{'benchmark':<40} {'case':<48} {'ours':>10} {'XLA':>10} {'unit':<5} {'ratio':>7}  note")
    for r in rows:
        print(f"{r['benchmark']:<40} {r['case']:<48} {r['ours']:>10.3f} {r['xla']:>10.3f} {r['unit']:<5} "
              f"{r['ratio']:>7.3f}  {r['note']}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
