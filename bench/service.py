"""Service latency: POST /plan for the bundled L=8 dump on a local server, cached and uncached.

    .venv/bin/python bench/service.py [--uncached N] [--cached N]

Starts `spmd-planner serve` on a loopback port with a fresh plan store,
then times whole HTTP round trips: uncached requests (each with a slightly
different threshold, so each is planned anew in a worker process) and
cached ones (the same request again, answered from the store). Prints the
median of each, the same plan made in-process (the uncached round trip's
floor: the server's planner processes are started ahead, so a request pays
for planning, not for starting Python) and, for scale, XLA's compile of the
same module.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from xla_reference import compile_spmd, summary  # noqa: E402

from planner.data import DEFAULT_DUMP  # noqa: E402
from planner.hlo.text.compat import for_jaxlib_0_7  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _post(url: str, body: bytes) -> float:
    start = time.perf_counter()
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as r:
        r.read()
        assert r.status == 200
    return time.perf_counter() - start


def _in_process_plan_seconds(hlo: str, repeat: int) -> list[float]:
    """What the server's worker does for one request: parse the text and plan it."""
    from planner.hlo.text.parser import parse_hlo
    from planner.mesh import Mesh
    from planner.plan.planner import make_plan
    from planner.prepare import prepare

    times = []
    for k in range(max(repeat, 1)):
        start = time.perf_counter()
        make_plan(prepare(parse_hlo(hlo), mesh=Mesh.parse("fsdp=4,tp=2")), threshold=1.5 + k / 1000)
        times.append(time.perf_counter() - start)
    return times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--uncached", type=int, default=5)
    ap.add_argument("--cached", type=int, default=20)
    args = ap.parse_args()
    port = _free_port()
    with tempfile.TemporaryDirectory() as tmp:
        server = subprocess.Popen(
            [sys.executable, "-m", "planner", "serve", "--port", str(port), "--db", f"{tmp}/plans.sqlite3"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        try:
            for _ in range(150):
                try:
                    urllib.request.urlopen(f"{url}/healthz", timeout=1).read()
                    break
                except OSError:
                    time.sleep(0.2)
            hlo = DEFAULT_DUMP.read_text()
            mesh = {"shape": [4, 2], "axis_names": ["fsdp", "tp"]}

            def body(k: int) -> bytes:
                return json.dumps({"hlo": hlo, "mesh": mesh, "options": {"threshold": 1.5 + k / 1000}}).encode()

            uncached = [_post(f"{url}/plan", body(k)) for k in range(args.uncached)]
            cached = [_post(f"{url}/plan", body(0)) for _ in range(args.cached)]
        finally:
            server.terminate()
            server.wait(10)
    in_process = statistics.median(_in_process_plan_seconds(hlo, args.uncached))
    xla = compile_spmd(for_jaxlib_0_7(DEFAULT_DUMP.read_text()), allow_output=True)[1]
    print(f"POST /plan, {DEFAULT_DUMP.name} ({len(hlo.encode()) / 1e6:.2f} MB), local server:")
    print(f"  uncached median {statistics.median(uncached):.3f} s over {len(uncached)} (plan in a worker process)")
    ratio = statistics.median(uncached) / in_process
    print(f"  in-process plan median {in_process:.3f} s; uncached/in-process {ratio:.2f}")
    print(f"  cached   median {statistics.median(cached) * 1000:.1f} ms over {len(cached)}")
    print(f"  XLA compile of the same module {xla:.3f} s; uncached/XLA {statistics.median(uncached) / xla:.2f}")
    summary(
        "POST /plan uncached",
        DEFAULT_DUMP.name,
        statistics.median(uncached),
        xla,
        "s",
        statistics.median(uncached) / xla,
        "median round trip vs XLA's compile",
    )
    summary(
        "POST /plan uncached vs in-process",
        DEFAULT_DUMP.name,
        statistics.median(uncached),
        in_process,
        "s",
        statistics.median(uncached) / in_process,
        "median round trip vs parse + plan in the same process",
    )
    summary(
        "POST /plan cached",
        DEFAULT_DUMP.name,
        statistics.median(cached),
        xla,
        "s",
        statistics.median(cached) / xla,
        "median round trip vs XLA's compile",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
