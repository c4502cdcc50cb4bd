"""`spmd-planner serve` and `--hbm` as a user meets them: a busy port, a SIGTERM after jobs ran on Ray, a
capacity no chip has. Each runs the real command in a subprocess."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from live_server import BIN, free_port

# Parses, and names a 4x2 mesh's worth of devices; planned on 2x2 it fails inside the job, after Ray started.
SMALL_HLO = (
    "HloModule m, num_partitions=8\n\nENTRY e {\n  p = f32[8,1024]{1,0} parameter(0), sharding={devices=[4,2]<=[8]}\n"
    "  ROOT n = f32[8,1024]{1,0} negate(p)\n}\n"
)


def test_a_busy_port_is_one_line_and_no_serving_banner(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [str(BIN / "spmd-planner"), "serve", "--port", str(port), "--db", str(tmp_path / "p.sqlite3")],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr == (
        f"spmd-planner: cannot listen on 127.0.0.1:{port}: address already in use (another server? pick --port)\n"
    )


def _post_json(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())  # type: ignore[no-any-return]


def _serve(tmp_path: Path) -> tuple[subprocess.Popen[str], str]:
    """`spmd-planner serve` on a free port, once /healthz answers."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [str(BIN / "spmd-planner"), "serve", "--port", str(port), "--db", str(tmp_path / "p.sqlite3")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=2):
                return server, url
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                raise AssertionError(f"the server did not start: {server.communicate()}") from None
            time.sleep(0.2)


def _stopped(server: subprocess.Popen[str], how: signal.Signals) -> tuple[str, str]:
    server.send_signal(how)
    try:
        return server.communicate(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(10)


def test_sigterm_after_a_job_ran_on_ray_stops_quietly(tmp_path: Path) -> None:
    server, url = _serve(tmp_path)
    try:
        # A verify job starts the local Ray in the server's process; this one fails in its task (wrong mesh).
        mesh = {"shape": [2, 2], "axis_names": ["fsdp", "tp"]}
        job = _post_json(f"{url}/jobs", {"kind": "verify", "request": {"hlo": SMALL_HLO, "mesh": mesh}})
        deadline = time.monotonic() + 180
        while job["state"] not in ("done", "failed"):
            assert time.monotonic() < deadline, f"the job did not end: {job}"
            time.sleep(0.5)
            with urllib.request.urlopen(f"{url}/jobs/{job['id']}", timeout=10) as answer:
                job = json.loads(answer.read())
    finally:
        out, err = _stopped(server, signal.SIGTERM)
    assert server.returncode in (0, -signal.SIGTERM, 128 + signal.SIGTERM), err
    assert "SIGTERM received" not in err and "PC: @" not in err and "Traceback" not in err, err
    assert out.startswith(f"spmd-planner: serving on {url} ")


def test_ctrl_c_stops_quietly(tmp_path: Path) -> None:
    server, _ = _serve(tmp_path)
    _, err = _stopped(server, signal.SIGINT)
    assert server.returncode == 0 and "Traceback" not in err, err


@pytest.mark.parametrize(
    "hbm,message",
    [
        ("1000000TB", "HBM per chip of 1000000TB (909,494.7 TiB) is more than 1 PiB, far beyond any chip"),
        ("1025TiB", "HBM per chip of 1025TiB (1,025.0 TiB) is more than 1 PiB"),
    ],
    ids=["million_tb", "just_over_1pib"],
)
def test_an_hbm_no_chip_has_is_refused_as_a_unit_slip(hbm: str, message: str) -> None:
    for command in ("plan", "memory"):
        done = subprocess.run([sys.executable, "-m", "planner", command, "--hbm", hbm], capture_output=True,
                              text=True, timeout=120)  # fmt: skip
        assert done.returncode == 2 and done.stdout == ""
        assert f"argument --hbm: {message}" in done.stderr and "a unit slip?" in done.stderr


def test_an_hbm_of_1pib_is_still_a_capacity() -> None:
    done = subprocess.run([sys.executable, "-m", "planner", "memory", "--hbm", "1024TiB", "--json"],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
