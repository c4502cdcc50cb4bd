"""The plan workers: a job over its time limit leaves no process behind; identical jobs in flight run once."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import pytest

from api.worker import JobFailed, PlanWorkers


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by init) is gone for our purposes.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(") ", 1)[1][0] != "Z"


def test_a_timed_out_job_takes_what_it_started_with_it(tmp_path: Path) -> None:
    # A job that starts a grandchild (as verify starts XLA's compile) and never answers.
    pid_file = tmp_path / "grandchild.pid"
    script = (
        "import subprocess, sys, time\n"
        f"child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(300)\n"
    )
    workers = PlanWorkers(1, time_limit=2.0, command=(sys.executable, "-c", script))
    started = time.monotonic()
    with pytest.raises(JobFailed) as failed:
        asyncio.run(workers.run({}))
    # The answer comes at the time limit: a grandchild holding the job's pipes open does not keep the
    # request waiting for it (it would, for the grandchild's 300 s, were only the child killed).
    assert failed.value.status == 504 and time.monotonic() - started < 60
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(grandchild), "the compile the job started outlived it"


def test_identical_jobs_in_flight_run_once() -> None:
    workers = PlanWorkers(2, time_limit=30.0)
    runs = []

    async def work() -> str:
        runs.append(1)
        await asyncio.sleep(0.2)
        return "plan"

    async def many() -> list[tuple[str, bool]]:
        return list(await asyncio.gather(*(workers.once("same", work) for _ in range(16))))

    answers = asyncio.run(many())
    assert len(runs) == 1 and all(a == "plan" for a, _ in answers)
    assert sum(not joined for _, joined in answers) == 1


def test_a_failed_flight_fails_every_waiter_and_the_next_call_runs_again() -> None:
    workers = PlanWorkers(2, time_limit=30.0)
    runs = []

    async def work() -> str:
        runs.append(1)
        await asyncio.sleep(0.1)
        raise JobFailed(422, "bad module")

    async def many() -> list[object]:
        return list(await asyncio.gather(*(workers.once("k", work) for _ in range(4)), return_exceptions=True))

    answers = asyncio.run(many())
    assert len(runs) == 1 and all(isinstance(a, JobFailed) and a.status == 422 for a in answers)
    asyncio.run(many())
    assert len(runs) == 2
