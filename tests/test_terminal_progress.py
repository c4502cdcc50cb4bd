"""Progress on a terminal: stages with elapsed time, a ticking clock, nothing when not a terminal."""

from __future__ import annotations

import io
import os
import pty
import re
import subprocess
import sys
import time

from cli.terminal_progress import terminal_progress
from planner.progress import note


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_each_stage_gets_a_line_with_when_it_began_and_what_it_took() -> None:
    out, clock = FakeTerminal(), Clock()
    with terminal_progress(out, clock, interval=3600):
        note("planning: propagating shardings")
        clock.now += 1.25
        note("XLA:CPU: compiling the step as given")
        clock.now += 14.0
    lines = out.getvalue().split("\n")
    assert lines[0].endswith("spmd-planner: [  0.0 s] planning: propagating shardings (1.2 s)")
    assert lines[1].endswith("spmd-planner: [  1.2 s] XLA:CPU: compiling the step as given (14.0 s)")
    assert lines[2] == ""


def test_the_running_stage_s_clock_ticks() -> None:
    out = FakeTerminal()
    with terminal_progress(out, interval=0.05):
        note("XLA:TPU: compiling the patched step")
        time.sleep(0.3)
    assert "XLA:TPU: compiling the patched step ... 0 s" in out.getvalue()


def test_nothing_is_written_when_the_stream_is_not_a_terminal() -> None:
    out = io.StringIO()
    with terminal_progress(out, interval=0.01):
        note("planning: propagating shardings")
        time.sleep(0.05)
    assert out.getvalue() == ""


def test_the_cli_shows_its_stages_on_a_terminal_and_none_in_a_pipe() -> None:
    command = [sys.executable, "-m", "planner", "plan", "--mesh", "fsdp=4,tp=2"]
    piped = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert piped.returncode == 0 and "spmd-planner: [" not in piped.stderr
    # stderr on a pseudo-terminal, as a user's shell gives it.
    controller, terminal = pty.openpty()
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=terminal, timeout=300)
    os.close(terminal)
    seen = b""
    while True:
        try:
            chunk = os.read(controller, 4096)
        except OSError:
            break
        if not chunk:
            break
        seen += chunk
    os.close(controller)
    assert done.returncode == 0
    shown = seen.decode()
    assert "spmd-planner: [  0.0 s] preparing the module as cpu's compiler takes it (" in shown
    assert re.search(r"spmd-planner: \[ +\d+\.\d s\] planning: propagating shardings and sizing memory \(", shown)
