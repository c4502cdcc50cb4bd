"""Memory estimate: accuracy on every corpus case, speed on the largest file.

    .venv/bin/python bench/memory.py

1. For each case with XLA's numbers (torch_xla truth.json: torch_xla's own
   CPU buffer assignment; JAX xla.json: compiled memory stats), the corpus and
   the generated remat/Shardy fixtures, our predicted bytes per device next to
   XLA's, with the relative error.
2. For the largest corpus file: the time of our estimate (parse + propagate +
   memory) against jaxlib's SPMD compile of the same text on 8 CPU devices.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from xla_reference import compile_spmd, memory_total, summary  # noqa: E402

from planner import clear_caches  # noqa: E402
from planner.hlo.text.compat import for_jaxlib_0_7  # noqa: E402
from planner.hlo.text.parser import parse_hlo  # noqa: E402
from planner.memory import memory_report  # noqa: E402
from planner.prepare import prepare  # noqa: E402
from planner.propagation import PropagationOptions  # noqa: E402

SHARED = Path(os.environ.get("SPMD_SHARED_DIR", REPO.parent / "shared"))
# Remat and Shardy steps made by `python -m fidelity.generate`, with XLA's numbers.
GENERATED = REPO / "tests" / "fixtures" / "generated"


def largest_corpus_file() -> Path:
    return max((SHARED / "corpus").glob("*/*.hlo"), key=lambda p: p.stat().st_size)


def accuracy_table() -> None:
    import json

    print(f"{'case':<44} {'ours MB':>9} {'XLA MB':>9} {'error':>7} {'ours s':>7}")
    cases = (
        sorted((SHARED / "corpus").glob("torch_xla/*.truth.json"))
        + sorted((SHARED / "corpus").glob("jax/*.xla.json"))
        + sorted(GENERATED.glob("*.xla.json"))
    )
    for truth in cases:
        data = json.loads(truth.read_text())
        xla = data["memory"]["total_bytes"] if "memory" in data else data["xla_per_device_total_bytes"]
        text = truth.with_name(truth.name.split(".")[0] + ".hlo").read_text()
        clear_caches()
        start = time.perf_counter()
        ours = memory_report(prepare(parse_hlo(text))).total_bytes
        seconds = time.perf_counter() - start
        name = truth.name.split(".")[0]
        print(f"{name:<44} {ours / 1e6:>9.1f} {xla / 1e6:>9.1f} {(ours - xla) / xla:>+7.1%} {seconds:>7.3f}")
        summary("memory per device", name, ours / 1e6, xla / 1e6, "MB", ours / xla, "XLA's own numbers for the case")


def main() -> int:
    accuracy_table()
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else largest_corpus_file()
    text = for_jaxlib_0_7(path.read_text())
    clear_caches()
    start = time.perf_counter()
    # Both sides may shard the outputs, as torch_xla and JAX compile a step.
    report = memory_report(prepare(parse_hlo(text), options=PropagationOptions(allow_to_output=(True,))))
    ours_seconds = time.perf_counter() - start
    executable, xla_seconds = compile_spmd(text, allow_output=True)
    xla_total = memory_total(executable)
    print(f"\nlargest file: {path.name} ({path.stat().st_size / 1e6:.1f} MB of text)")
    print(f"  ours: {ours_seconds:.3f} s (parse + propagate + memory), {report.total_bytes:,} bytes per device")
    print(f"  XLA:  {xla_seconds:.3f} s (jaxlib compile, StableHLO path), {xla_total:,} bytes per device")
    print(f"  time ratio ours/XLA {ours_seconds / xla_seconds:.3f}")
    print("  (jaxlib's StableHLO pipeline is not torch_xla's: byte totals differ for torch_xla dumps;")
    print("   the table above compares each case with the XLA that produced it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
