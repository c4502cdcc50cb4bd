"""Planning off the event loop: one child process per plan, with a time limit.

A plan is CPU-bound Python (and, with verify, a real XLA compile), so it
runs in a fresh interpreter (`python -m api.plan_job`) fed the job as JSON on
stdin. The server awaits it without blocking: a plan over its time limit is
killed (504), and a child that dies (out of memory, a crash inside XLA) is
reported (500) without taking the server or any other plan with it. At most
`max_workers` plans run at once; the rest wait their turn.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any


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
        self._slots = asyncio.Semaphore(max_workers)

    async def run(self, job: dict[str, Any]) -> dict[str, Any]:
        async with self._slots:
            result = await self._run(json.dumps(job).encode())
        if "status" in result:
            raise JobFailed(result["status"], result["message"], result.get("line"), result.get("column"))
        return result

    async def _run(self, payload: bytes) -> dict[str, Any]:
        child = await asyncio.create_subprocess_exec(
            *self.command,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            out, err = await asyncio.wait_for(child.communicate(payload), self.time_limit)
        except TimeoutError:
            raise JobFailed(504, f"planning took longer than the time limit of {self.time_limit:g} s") from None
        finally:
            if child.returncode is None:
                child.kill()
                await child.wait()
        if child.returncode != 0 or not out.strip():
            tail = " ".join(err.decode(errors="replace").strip().splitlines()[-2:])
            raise JobFailed(500, f"the planner process died (exit code {child.returncode}): {tail}".rstrip(": "))
        return json.loads(out)  # type: ignore[no-any-return]
