"""Jobs in the store: every state change is one conditional UPDATE, so replicas and workers never race.

A job moves queued -> running -> done | failed. Each dispatch is an attempt with its own number; a
worker writes only while the row still carries its attempt, so a worker that was given up on (its
heartbeat stopped, the job retried elsewhere) can no longer touch the row. Whoever notices a stale
heartbeat first retries the job, or fails it with the reason once its attempts are spent.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, func, select, update

from api.store import PlanStore
from api.store_schema import jobs

ACTIVE = ("queued", "running")
FINISHED = ("done", "failed")


@dataclass(frozen=True)
class Job:
    id: str
    kind: str
    state: str
    progress: float
    message: str
    request: dict[str, Any]
    result: dict[str, Any] | None
    error: str | None
    attempt: int
    owner: str
    replica: str
    created_at: float
    updated_at: float
    heartbeat_at: float


def _job(row: Any) -> Job:
    return Job(row.id, row.kind, row.state, row.progress, row.message, json.loads(row.request_json),
               json.loads(row.result_json) if row.result_json else None, row.error, row.attempt, row.owner,
               row.replica, row.created_at, row.updated_at, row.heartbeat_at)  # fmt: skip


class JobStore:
    def __init__(self, store: PlanStore) -> None:
        self.store = store
        self.engine = store.engine

    def create(self, kind: str, request: dict[str, Any], owner: str, replica: str) -> Job:
        now = time.time()
        job_id = uuid.uuid4().hex
        row = {"id": job_id, "kind": kind, "state": "queued", "progress": 0.0, "message": "queued",
               "request_json": json.dumps(request), "result_json": None, "error": None, "attempt": 1,
               "owner": owner, "replica": replica, "created_at": now, "updated_at": now,
               "heartbeat_at": now}  # fmt: skip
        with self.engine.begin() as db:
            db.execute(jobs.insert().values(**row))
        found = self.get(job_id)
        assert found is not None
        return found

    def get(self, job_id: str) -> Job | None:
        with self.engine.connect() as db:
            row = db.execute(select(jobs).where(jobs.c.id == job_id)).first()
        return _job(row) if row else None

    def recent(self, limit: int) -> list[Job]:
        with self.engine.connect() as db:
            rows = db.execute(select(jobs).order_by(jobs.c.created_at.desc(), jobs.c.id).limit(limit)).all()
        return [_job(r) for r in rows]

    def active_for(self, owner: str) -> int:
        with self.engine.connect() as db:
            count = db.execute(
                select(func.count()).select_from(jobs).where(jobs.c.owner == owner, jobs.c.state.in_(ACTIVE))
            ).scalar_one()
        return int(count)

    def _write(self, job_id: str, at_attempt: int, states: tuple[str, ...], **values: Any) -> bool:
        """Writes `values` if the row is still at `at_attempt` in one of `states`; whether it was."""
        now = time.time()
        with self.engine.begin() as db:
            done = db.execute(
                update(jobs)
                .where(and_(jobs.c.id == job_id, jobs.c.attempt == at_attempt, jobs.c.state.in_(states)))
                .values(updated_at=now, **values)
            )
        return bool(done.rowcount == 1)

    def start(self, job_id: str, attempt: int) -> bool:
        return self._write(job_id, attempt, ("queued",), state="running", message="started",
                           heartbeat_at=time.time())  # fmt: skip

    def beat(self, job_id: str, attempt: int) -> bool:
        return self._write(job_id, attempt, ("running",), heartbeat_at=time.time())

    def report(self, job_id: str, attempt: int, progress: float, message: str) -> bool:
        return self._write(job_id, attempt, ("running",), progress=progress, message=message[:500],
                           heartbeat_at=time.time())  # fmt: skip

    def finish(self, job_id: str, attempt: int, result: dict[str, Any]) -> bool:
        return self._write(job_id, attempt, ACTIVE, state="done", progress=1.0, message="done",
                           result_json=json.dumps(result))  # fmt: skip

    def fail(self, job_id: str, attempt: int, error: str) -> bool:
        return self._write(job_id, attempt, ACTIVE, state="failed", message="failed", error=error[:4000])

    def beat_queued(self, replica: str) -> None:
        """The replica that sent attempts still waiting for a worker says it lives (its Ray holds them)."""
        with self.engine.begin() as db:
            db.execute(
                update(jobs).where(jobs.c.state == "queued", jobs.c.replica == replica).values(heartbeat_at=time.time())
            )

    def stale(self, seconds: float) -> list[Job]:
        """Active jobs not heard from in `seconds`: running ones whose worker stopped beating, queued ones
        whose replica stopped beating for them."""
        with self.engine.connect() as db:
            rows = db.execute(
                select(jobs).where(jobs.c.state.in_(ACTIVE), jobs.c.heartbeat_at < time.time() - seconds)
            ).all()
        return [_job(r) for r in rows]

    def retry(self, job: Job, why: str, replica: str) -> bool:
        """The next attempt, queued and sent by `replica`; False when another replica got there first."""
        return self._write(job.id, job.attempt, ACTIVE, state="queued", attempt=job.attempt + 1, progress=0.0,
                           message=f"retrying: {why}", heartbeat_at=time.time(), replica=replica)  # fmt: skip
