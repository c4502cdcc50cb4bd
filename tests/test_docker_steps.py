"""The service image's steps, run for real: docker/Dockerfile's COPY, RUN and CMD in a fresh virtual environment.

No container engine runs here, so this test is the image's check: it reads
the Dockerfile, copies what it copies, runs each RUN in order with the
build arguments' defaults (and again with WITH_VERIFY=true), then starts the
CMD (on a free port) and asks `/healthz` and `POST /plan`. Anything the image
needs that these steps do not install makes this test fail.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import REPO
from live_server import free_port

DOCKERFILE = REPO / "docker" / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(keyword, argument) per instruction, continuation lines joined."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        keyword, _, argument = line.partition(" ")
        out.append((keyword.upper(), argument.strip()))
    return out


@pytest.mark.xla
def test_dockerfile_steps_install_and_serve(tmp_path: Path) -> None:
    steps = instructions()
    assert steps[0] == ("FROM", "python:3.11-slim") and sys.version_info[:2] == (3, 11)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    env = {**os.environ, "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}", "VIRTUAL_ENV": str(venv)}
    env.pop("PYTHONPATH", None)
    args: dict[str, str] = {}
    app = tmp_path / "app"
    command: list[str] = []
    for keyword, argument in steps:
        if keyword == "ARG":
            name, _, default = argument.partition("=")
            args[name] = default
        elif keyword == "ENV":
            for pair in shlex.split(argument):
                name, _, value = pair.partition("=")
                env[name] = str(tmp_path / "data" / Path(value).name) if value.startswith("/data") else value
        elif keyword == "WORKDIR":
            app.mkdir(parents=True, exist_ok=True)
        elif keyword == "COPY":
            *sources, _ = shlex.split(argument)
            for source in sources:
                path = REPO / source
                target = app / source
                if path.is_dir():
                    shutil.copytree(path, target, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
                else:
                    shutil.copy2(path, target)
        elif keyword == "RUN":
            done = subprocess.run(["sh", "-c", argument], cwd=app, env={**env, **args}, capture_output=True,
                                  text=True, timeout=1200)  # fmt: skip
            assert done.returncode == 0, f"RUN {argument}\n{done.stderr[-2000:]}"
        elif keyword == "CMD":
            command = json.loads(argument)
    assert (REPO / "docker" / "compose.yaml").is_file()

    # The image has no torch stack and no jax unless asked for.
    probe = "import importlib.util as u; print([m for m in ('torch', 'torch_xla', 'jax') if u.find_spec(m)])"
    assert subprocess.run([str(venv / "bin" / "python"), "-c", probe], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=60).stdout.strip() == "[]"  # fmt: skip

    port = free_port()
    command[command.index("--port") + 1] = str(port)
    server = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                health = json.loads(urllib.request.urlopen(f"{url}/healthz", timeout=2).read())
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, "the CMD did not start a server"
                time.sleep(0.3)
        assert health == {"status": "ok", "stored_plans": 0}
        body = json.dumps({"hlo": (REPO / "planner" / "data" / "llama_scan_L8_fsdp4_tp2.hlo").read_text(),
                           "mesh": {"shape": [4, 2], "axis_names": ["fsdp", "tp"]}}).encode()  # fmt: skip
        request = urllib.request.Request(f"{url}/plan", body, {"Content-Type": "application/json"})
        plan = json.loads(urllib.request.urlopen(request, timeout=300).read())["plan"]
        assert plan["hbm"]["total_after"] < plan["hbm"]["total_before"]
        assert (tmp_path / "data" / "plans.sqlite3").is_file()  # the store is where the image's ENV puts it
    finally:
        server.terminate()
        server.wait(10)

    # The verify variant: the same RUN steps with WITH_VERIFY=true add real XLA.
    for keyword, argument in steps:
        if keyword == "RUN" and "WITH_VERIFY" in argument:
            done = subprocess.run(["sh", "-c", argument], cwd=app, env={**env, "WITH_VERIFY": "true"},
                                  capture_output=True, text=True, timeout=1200)  # fmt: skip
            assert done.returncode == 0, done.stderr[-2000:]
    tiny = "HloModule m, num_partitions=8\n\nENTRY e {\n  ROOT p = f32[8,16]{1,0} parameter(0), sharding={devices=[8,1]<=[8]}\n}\n"
    check = subprocess.run([str(venv / "bin" / "python"), "-m", "planner.plan.compilers.xla_compile"],
                           input=json.dumps({"hlo": tiny, "num_devices": 8}), capture_output=True, text=True,
                           env=env, cwd=tmp_path, timeout=300)  # fmt: skip
    assert check.returncode == 0, check.stderr[-2000:]
    # The verify extra asks for a range (jax>=0.7.1): the report names the jaxlib pip chose for this Python.
    installed = subprocess.run([str(venv / "bin" / "python"), "-c", "import jaxlib; print(jaxlib.__version__)"],
                               capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)  # fmt: skip
    assert installed.returncode == 0 and installed.stdout.strip(), installed.stderr[-2000:]
    assert json.loads(check.stdout.splitlines()[-1])["xla"].startswith(f"jaxlib {installed.stdout.strip()} (XLA GSPMD")
