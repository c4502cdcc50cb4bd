"""Planning off the event loop: one child process per plan, with a time limit.

A plan is CPU-bound Python (and, with verify, a real XLA compile), so it
runs in a fresh interpreter (`python -m api.plan_job`) fed the job as JSON on
stdin. The server awaits it without blocking: a plan over its time limit is
killed (504), and a child that dies (out of memory, a crash inside XLA) is
reported (500) without taking the server or any other plan with it. At most
`max_workers` plans run at once; the rest wait their turn.

Each child leads a process group of its own, and a plan over its time limit is ended by killing the
group: verify's compile runs in a grandchild, which would otherwise outlive its parent at full CPU.

Identical requests in flight at once are planned once (`once`): the first computes, the others wait
for its answer.

Children are started ahead of need: `max_workers` spares wait, interpreter
started and planner imported, blocked on reading their job. A request takes a
spare and a new one is started behind it, so a plan no longer pays for
starting Python and importing the planner (about a second), while each plan
still has a process of its own to kill.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")


class JobFailed(Exception):
    """A plan that could not be made: `status` is the HTTP status that says why."""

    def __init__(self, status: int, message: str, line: int | None = None, column: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.line = line
        self.column = column


class PlanWorkers:
    """Runs plan jobs in child processes, `max_workers` at a time."""

    def __init__(self, max_workers: int, time_limit: float, command: tuple[str, ...] | None = None) -> None:
        self.time_limit = time_limit
        self.command = command or (sys.executable, "-m", "api.plan_job")
        self.max_workers = max_workers
        self._slots = asyncio.Semaphore(max_workers)
        self._spares: list[asyncio.subprocess.Process] = []
        self._starting = asyncio.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        # Spares are kept only once `warm_up` ran (a server's lifespan): a loop that lives for one
        # request would leave them behind.
        self._warm = False
        self._flights: dict[str, asyncio.Future[Any]] = {}

    def _on_this_loop(self) -> None:
        """Spares belong to the event loop that started them; on another loop (a test client's
        per-request loop) they cannot be driven, so they are stopped and forgotten."""
        loop = asyncio.get_running_loop()
        if self._loop is loop:
            return
        for child in self._spares:
            _kill_group(child)
        self._spares, self._starting, self._loop = [], asyncio.Lock(), loop
        self._flights = {}

    async def _start(self) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            *self.command,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )  # fmt: skip

    async def warm_up(self) -> None:
        """Start spares until `max_workers` wait: at server start, and from then on behind every job taken."""
        self._warm = True
        await self._refill()

    async def _refill(self) -> None:
        self._on_this_loop()
        async with self._starting:
            while len(self._spares) < self.max_workers:
                self._spares.append(await self._start())

    async def close(self) -> None:
        """Stop the waiting spares (at server shutdown)."""
        self._on_this_loop()
        spares, self._spares = self._spares, []
        for child in spares:
            if child.returncode is None:
                _kill_group(child)
                await child.wait()

    async def _take(self) -> asyncio.subprocess.Process:
        # A spare that exited while waiting (killed from outside) is not handed a job.
        self._on_this_loop()
        while self._spares:
            child = self._spares.pop(0)
            if child.returncode is None:
                return child
        return await self._start()

    async def once(self, key: str, work: Callable[[], Awaitable[T]]) -> tuple[T, bool]:
        """`work()`'s result and False; while a call with the same key is in flight, that call's result
        and True instead (its error, if it fails). The work goes on if the caller that started it leaves."""
        self._on_this_loop()
        flight = self._flights.get(key)
        if flight is not None:
            return await asyncio.shield(flight), True
        flight = asyncio.ensure_future(work())
        self._flights[key] = flight

        def landed(done: asyncio.Future[Any]) -> None:
            if self._flights.get(key) is done:
                del self._flights[key]
            if not done.cancelled():
                done.exception()  # retrieved here: every waiter may have left

        flight.add_done_callback(landed)
        return await asyncio.shield(flight), False

    async def run(self, job: dict[str, Any]) -> dict[str, Any]:
        async with self._slots:
            result = await self._run(json.dumps(job).encode())
        if "status" in result:
            raise JobFailed(result["status"], result["message"], result.get("line"), result.get("column"))
        return result

    async def _run(self, payload: bytes) -> dict[str, Any]:
        child = await self._take()
        try:
            out, err = await asyncio.wait_for(child.communicate(payload), self.time_limit)
        except TimeoutError:
            raise JobFailed(504, f"planning took longer than the time limit of {self.time_limit:g} s") from None
        finally:
            # The child if it still runs, and whatever it started and left behind.
            _kill_group(child)
            if child.returncode is None:
                await child.wait()
            # The next spare starts once this plan is done: on a small machine a spare importing the
            # planner beside a running plan would slow the plan down by as much as it saves.
            if self._warm:
                await self._refill()
        if child.returncode != 0 or not out.strip():
            tail = " ".join(err.decode(errors="replace").strip().splitlines()[-2:])
            raise JobFailed(500, f"the planner process died (exit code {child.returncode}): {tail}".rstrip(": "))
        return json.loads(out)  # type: ignore[no-any-return]


def _kill_group(child: asyncio.subprocess.Process) -> None:
    """Kill the child's process group: the child and whatever it started (verify's compile)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, signal.SIGKILL)
