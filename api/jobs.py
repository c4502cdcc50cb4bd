"""The service's side of jobs: record a job, send it to Ray, and retry or fail jobs whose worker stopped.

Jobs run as Ray tasks: on a local Ray the replica starts at its first job (`ray.init()`), or on a
cluster named by `SPMD_PLANNER_RAY_ADDRESS`. A task writes everything it has to say into the job's
row (`job_runner`), so any replica answers for any job, and a replica that restarts loses nothing:
the row stays, and every replica checks every few seconds for jobs whose worker stopped beating,
retrying each (a new attempt, on its own Ray) until its attempts are spent, then failing it with the
reason. Ray's own retries are off: the row, not Ray, decides what runs again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from api.job_store import Job, JobStore
from api.settings import Settings
from planner.search.ray_tasks import driver_path, task_memory

log = logging.getLogger("spmd_planner.api")
GIB = 1 << 30
# What a job's own task may hold at once: a verify runs the planner and XLA's compiles itself; a search
# sends its candidates to tasks of their own (which ask for theirs) and only waits.
JOB_MEMORY_BYTES = {"verify": 6 * GIB, "search": GIB // 2}


class JobQueue:
    def __init__(self, jobs: JobStore, settings: Settings) -> None:
        self.jobs = jobs
        self.settings = settings
        self._ray_lock = threading.Lock()
        # One thread, alive as long as the queue, starts Ray and sends jobs: Ray's head processes die with
        # the thread that started them (they are its children with a parent-death signal), so a
        # short-lived thread would take the local Ray down as soon as it ended.
        self._sender = ThreadPoolExecutor(max_workers=1, thread_name_prefix="jobs-to-ray")
        self._started_ray = False
        self._tasks: dict[str, Any] = {}
        self._watching: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # This replica, as the jobs it sends to Ray name it.
        self.replica = uuid.uuid4().hex[:16]

    # -- Ray ------------------------------------------------------------------------------------

    def _remote(self, kind: str) -> Any:
        """The Ray task for a job of `kind`, Ray started on first use (local unless an address is configured)."""
        with self._ray_lock:
            if kind in self._tasks:
                return self._tasks[kind]
            import ray

            from api.job_runner import run_job

            if not ray.is_initialized():
                os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
                ray.init(address=self.settings.ray_address, include_dashboard=False, log_to_driver=False,
                         logging_level="ERROR")  # fmt: skip
                self._started_ray = True
                self._python_handles_sigterm()
            self._tasks[kind] = ray.remote(run_job).options(
                num_cpus=1,
                memory=task_memory(JOB_MEMORY_BYTES[kind]),
                max_retries=0,
                runtime_env={"env_vars": {"PYTHONPATH": driver_path()}},
            )
            return self._tasks[kind]

    def _python_handles_sigterm(self) -> None:
        """Ray's driver installs a native crash handler for SIGTERM as for SIGSEGV (absl's failure signal
        handler): the signal that stops a server would print a C stack and end the process before the
        server shuts down. The handler Python had (uvicorn's graceful shutdown) is set again, from the
        event loop's thread when that is the main thread, the only one Python lets set it."""
        handler = signal.getsignal(signal.SIGTERM)
        if self._loop is None or handler is None:
            return

        def restore() -> None:
            if threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGTERM, handler)

        with contextlib.suppress(RuntimeError):  # the loop closed: the server is stopping anyway
            self._loop.call_soon_threadsafe(restore)

    def dispatch(self, job: Job) -> None:
        """Sends the job's current attempt to Ray; the result comes back through the row, not here."""
        self._remote(job.kind).remote(self.jobs.store.url, job.id, job.attempt, self.settings.job_heartbeat_seconds)

    def submit(self, kind: str, request: dict[str, Any], owner: str) -> Job:
        """Records the job and answers at once: sending it to Ray (starting a local Ray on the first job
        takes seconds) happens on a thread of its own."""
        job = self.jobs.create(kind, request, owner, self.replica)
        self._sender.submit(self._dispatch_or_fail, job)
        return job

    def _dispatch_or_fail(self, job: Job) -> None:
        try:
            self.dispatch(job)
        except Exception as e:  # Ray not reachable: the job says so and ends
            self.jobs.fail(job.id, job.attempt, f"could not start the job on Ray: {type(e).__name__}: {e}")

    # -- jobs whose worker stopped ------------------------------------------------------------------

    def check(self) -> list[tuple[Job, str]]:
        """Retries or fails every job whose worker stopped; what was done to each."""
        s = self.settings
        done: list[tuple[Job, str]] = []
        for job in self.jobs.stale(s.job_stale_seconds):
            if job.state == "running":
                why = f"the worker running attempt {job.attempt} stopped (no heartbeat for {s.job_stale_seconds:g} s)"
            else:
                why = f"the replica that sent attempt {job.attempt} stopped before a worker started it"
            if job.attempt < s.job_attempts:
                if self.jobs.retry(job, why, self.replica):
                    retried = self.jobs.get(job.id)
                    assert retried is not None
                    self._sender.submit(self._dispatch_or_fail, retried)
                    done.append((job, "retried"))
            elif self.jobs.fail(job.id, job.attempt, f"{why}; {job.attempt} attempts made, none finished"):
                done.append((job, "failed"))
        for job, action in done:
            log.info("job %s %s (attempt %d): %s", job.id, action, job.attempt, job.state)
        return done

    async def watch(self) -> None:
        """Every few seconds, for as long as the server runs: beat for the attempts this replica sent that
        wait for a worker, then `check`."""
        while True:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self.jobs.beat_queued, self.replica)
                await asyncio.to_thread(self.check)
            await asyncio.sleep(self.settings.job_check_seconds)

    def start_watching(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._watching = self._loop.create_task(self.watch())

    async def close(self) -> None:
        if self._watching is not None:
            self._watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watching
        if self._started_ray:
            import ray

            await asyncio.wrap_future(self._sender.submit(ray.shutdown))
        self._sender.shutdown(wait=False, cancel_futures=True)
