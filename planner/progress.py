"""What a long step is doing now, for whoever watches: a job's progress bar, a terminal line.

Deep code says what it starts (`note("XLA:TPU: compiling the patched step")`); a caller that wants to
know installs a reporter around the call (`with reporting(callback): ...`). Without one, a note costs
a context-variable lookup. A context variable, not a parameter threaded through every layer: planning
and verifying stay the same calls whether or not anyone watches.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

Reporter = Callable[[str], None]

_reporter: ContextVar[Reporter | None] = ContextVar("spmd_planner_progress", default=None)


def note(message: str) -> None:
    """Tells the installed reporter, if any, that `message` starts now."""
    reporter = _reporter.get()
    if reporter is not None:
        reporter(message)


@contextmanager
def reporting(reporter: Reporter) -> Iterator[None]:
    """Every `note` inside the block goes to `reporter`."""
    token = _reporter.set(reporter)
    try:
        yield
    finally:
        _reporter.reset(token)
