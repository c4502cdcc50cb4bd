"""Every command in the README runs, and shown output is the command's real output.

Commands are the lines of the README's `bash` blocks, run from the
repository root exactly as written. A `bash` block followed directly by a
`text` block is a worked example: its output must equal that text, or begin
with it when the text's last line is `...`. A line
ending in `&` starts a server: it is started, asked `/healthz`, and stopped.
`make test` is the command CI runs (`.ci/run`); it is checked to be exactly
that, not run from inside its own tests.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import REPO

from planner.data import DEFAULT_DUMP

README = (REPO / "README.md").read_text()
_BLOCK = re.compile(r"```(\w+)\n(.*?)```", re.S)


def blocks() -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in _BLOCK.finditer(README)]


def commands() -> list[tuple[str, str | None]]:
    """(command, expected output or None), in README order."""
    found = []
    listed = blocks()
    for i, (kind, body) in enumerate(listed):
        if kind != "bash":
            continue
        lines = [line for line in body.splitlines() if line.strip() and not line.lstrip().startswith("#")]
        golden = listed[i + 1][1] if i + 1 < len(listed) and listed[i + 1][0] == "text" else None
        found.extend((line, golden if len(lines) == 1 else None) for line in lines)
    return found


COMMANDS = commands()


def test_the_readme_has_the_two_setup_commands_and_ci_runs_the_test_one() -> None:
    assert [c for c, _ in COMMANDS[:2]] == ["make run", "make test"]
    ci = (REPO / ".ci" / "run").read_text()
    assert [line for line in ci.splitlines() if line and not line.startswith("#")][-1] == "exec make test"


@pytest.mark.parametrize(
    "command,golden", [c for c in COMMANDS if c[0] != "make test"], ids=[c for c, _ in COMMANDS if c != "make test"]
)
def test_readme_command_runs(command: str, golden: str | None) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if command.endswith("&"):
        port = re.search(r"--port (\d+)", command)
        assert port, "a background server command names its port"
        server = subprocess.Popen(command.rstrip("& "), shell=True, cwd=REPO, env=env, start_new_session=True,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port.group(1)}/healthz", timeout=2) as r:
                        assert json.loads(r.read())["status"] == "ok"
                        return
                except OSError:
                    assert server.poll() is None and time.monotonic() < deadline, "the server did not start"
                    time.sleep(0.3)
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(10)
    done = subprocess.run(command, shell=True, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, f"{command}\n{done.stderr[-3000:]}"
    if golden is not None and golden.endswith("...\n"):
        assert done.stdout.startswith(golden.removesuffix("...\n"))
    elif golden is not None:
        assert done.stdout == golden


def test_make_run_prints_the_verdict_and_how_to_open_the_dashboard() -> None:
    done = subprocess.run(["make", "--no-print-directory", "run"], cwd=REPO, capture_output=True, text=True,
                          timeout=1800)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    # (make may install first when pyproject.toml is newer than the venv: the report follows.)
    lines = done.stdout.splitlines()
    start = lines.index("plan for SyncTensorsGraph.2649 on mesh fsdp=4,tp=2")
    assert lines[start + 1].startswith("  verdict: fits: 234.2 MiB per chip after the plan")
    assert lines[-1].startswith("dashboard: .venv/bin/spmd-planner serve, then open http://127.0.0.1:8000/")


def _python_blocks() -> list[str]:
    return [body for kind, body in blocks() if kind == "python"]


def test_every_python_snippet_is_run_or_quoted_from_a_file_that_is() -> None:
    """A snippet is either whole (run below) or an excerpt of a file the tests run, quoted verbatim."""
    for body in _python_blocks():
        first = body.splitlines()[0]
        quoted = re.match(r"# from (\S+\.py)", first)
        if quoted is None:
            continue
        source = (REPO / quoted.group(1)).read_text()
        excerpt = textwrap.dedent("\n".join(body.splitlines()[2:]))
        assert textwrap.indent(excerpt, "    ") in source or excerpt in source, f"not in {quoted.group(1)}:\n{excerpt}"


@pytest.mark.parametrize("body", [b for b in _python_blocks() if not b.startswith("# from ")], ids=lambda b: b[:40])
def test_python_snippet_runs_as_printed_and_prints_what_its_comments_say(body: str, tmp_path: Path) -> None:
    # The library snippet reads "step.hlo": the bundled dump, under that name.
    shutil.copy(DEFAULT_DUMP, tmp_path / "step.hlo")
    done = subprocess.run([sys.executable, "-c", body], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    printed = done.stdout.splitlines()
    # `print(...)  # VALUE: words` promises VALUE as the last line that print wrote.
    promised = [m.group(1) for m in re.finditer(r"^print\(.*\)\s+# (.+?):", body, re.M)]
    assert promised and all(p in printed for p in promised), (promised, printed[-5:])
