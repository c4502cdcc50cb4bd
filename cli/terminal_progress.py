"""Progress on a terminal: each stage a long command starts (`planner.progress.note`) on a line of its own
with the time since the command began, the current line's clock ticking once a second, and what each
finished stage took. Quiet when the stream is not a terminal: a log or a pipe gets nothing.

    spmd-planner: [  0.0 s] planning: propagating shardings and sizing memory (1.2 s)
    spmd-planner: [  1.2 s] verifying the plan with real compiles (0.1 s)
    spmd-planner: [  1.3 s] XLA:CPU: compiling the step as given ... 14 s
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO

from planner.progress import reporting


class _Board:
    """The terminal's current line: the stage running and when it began."""

    def __init__(self, stream: TextIO, clock: Callable[[], float]) -> None:
        self.stream, self.clock = stream, clock
        self.start = clock()
        self.stage: str | None = None
        self.stage_start = self.start
        self.lock = threading.Lock()

    def _head(self) -> str:
        return f"\r\x1b[2Kspmd-planner: [{self.stage_start - self.start:5.1f} s] {self.stage}"

    def begin(self, stage: str) -> None:
        with self.lock:
            self._finish_line()
            self.stage, self.stage_start = stage, self.clock()
            self.stream.write(self._head())
            self.stream.flush()

    def tick(self) -> None:
        with self.lock:
            if self.stage is not None:
                self.stream.write(f"{self._head()} ... {self.clock() - self.stage_start:.0f} s")
                self.stream.flush()

    def _finish_line(self) -> None:
        if self.stage is not None:
            self.stream.write(f"{self._head()} ({self.clock() - self.stage_start:.1f} s)\n")
            self.stage = None

    def close(self) -> None:
        with self.lock:
            self._finish_line()
            self.stream.flush()


@contextmanager
def terminal_progress(
    stream: TextIO | None = None, clock: Callable[[], float] = time.monotonic, interval: float = 1.0
) -> Iterator[None]:
    """Report the stages noted inside the block on `stream` (stderr) when it is a terminal."""
    stream = stream if stream is not None else sys.stderr
    if not stream.isatty():
        yield
        return
    board = _Board(stream, clock)
    stop = threading.Event()

    def ticking() -> None:
        while not stop.wait(interval):
            board.tick()

    ticker = threading.Thread(target=ticking, name="terminal-progress", daemon=True)
    ticker.start()
    try:
        with reporting(board.begin):
            yield
    finally:
        stop.set()
        ticker.join()
        board.close()
