"""Starting a job, as POST /jobs and the dashboard's Verify buttons both do: the caller's quota, a search
builder the operator allows, and HLO that parses are checked before the job is recorded, so a job that
cannot run is refused at once instead of failing minutes later."""

from __future__ import annotations

from fastapi import HTTPException

from api.job_store import Job
from api.jobs import JobQueue
from api.planning import check_parses
from api.settings import Settings
from planner.wire import JobRequest


def start_job(body: JobRequest, caller: str, jobs: JobQueue, settings: Settings) -> Job:
    active = jobs.jobs.active_for(caller)
    if active >= settings.jobs_per_token:
        raise HTTPException(429, f"quota: {active} jobs of this token are queued or running (at most "
                            f"{settings.jobs_per_token}); wait for one to end")  # fmt: skip
    if body.search is not None and body.search.builder not in settings.search_builders:
        allowed = ", ".join(settings.search_builders) or "none (SPMD_PLANNER_SEARCH_BUILDERS is empty)"
        raise HTTPException(422, f"step builder {body.search.builder!r} is not one this service runs: {allowed}")
    if body.kind == "verify" and body.request is not None:
        check_parses(body.request)
    return jobs.submit(body.kind, body.payload(), caller)
