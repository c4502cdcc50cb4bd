"""Parse speed: this parser against XLA's C++ parser on every corpus file.

    .venv/bin/python bench/parse.py [--repeat N]

For each file both parsers read the same text (for the JAX dumps, the text
with newer-XLA debug tables removed, which jaxlib 0.7.1 cannot read), N times
each; the median time gives MB/s. The ratio is ours / XLA's: >= 1.0 means
this parser is at least as fast.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

sys.path.insert(0, str(REPO / "bench"))

from xla_reference import summary  # noqa: E402

from planner import clear_caches  # noqa: E402
from planner.hlo.text.compat import for_jaxlib_0_7  # noqa: E402
from planner.hlo.text.parser import parse_hlo  # noqa: E402

SHARED = Path(os.environ.get("SPMD_SHARED_DIR", REPO.parent / "shared"))


def median_seconds(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def ours(text: str) -> None:
    # A cold parse each time: the sharding cache is per process.
    clear_caches()
    parse_hlo(text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    from jax._src.lib import xla_client

    files = sorted((SHARED / "corpus").glob("*/*.hlo"))
    print(f"{'file':<48} {'KB':>7} {'ours MB/s':>10} {'XLA MB/s':>9} {'ratio':>6}")
    ratios = []
    total_bytes = total_ours = total_xla = 0.0
    for path in files:
        text = for_jaxlib_0_7(path.read_text())
        size = len(text.encode())
        t_ours = median_seconds(lambda text=text: ours(text), args.repeat)
        t_xla = median_seconds(lambda text=text: xla_client._xla.hlo_module_from_text(text), args.repeat)
        ratio = t_xla / t_ours
        ratios.append(ratio)
        total_bytes += size
        total_ours += t_ours
        total_xla += t_xla
        speeds = f"{size / t_ours / 1e6:>10.1f} {size / t_xla / 1e6:>9.1f}"
        print(f"{path.name:<48} {size / 1e3:>7.0f} {speeds} {ratio:>6.2f}")
    print(
        f"{'all files':<48} {total_bytes / 1e3:>7.0f} {total_bytes / total_ours / 1e6:>10.1f} "
        f"{total_bytes / total_xla / 1e6:>9.1f} {total_xla / total_ours:>6.2f}"
    )
    print(f"ratio ours/XLA: median {statistics.median(ratios):.2f}, min {min(ratios):.2f}, max {max(ratios):.2f}")
    summary(
        "parse",
        "all corpus files",
        total_bytes / total_ours / 1e6,
        total_bytes / total_xla / 1e6,
        "MB/s",
        total_xla / total_ours,
        "ratio = XLA time / ours (>= 1: we are faster)",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
