"""The real service in a subprocess on a loopback port, for end-to-end tests."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def live_server(db: Path, *extra: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """`spmd-planner serve` on a free loopback port; yields its URL once /healthz answers (30 s at most)."""
    port = free_port()
    process = subprocess.Popen(
        [str(BIN / "spmd-planner"), "serve", "--port", str(port), "--db", str(db), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{url}/healthz", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    output = process.stdout.read() if process.stdout and process.poll() is not None else ""
                    raise RuntimeError(f"server did not start: {output}") from None
                time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
