"""Response models of `/jobs` (its request, `JobRequest`, is `planner.wire`'s)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from api.job_store import Job
from planner.plan.model import VerifyNotRun

JobState = Literal["queued", "running", "done", "failed"]


class JobLinks(BaseModel):
    self: str
    events: str = Field(description="server-sent events: one `progress` event per change, `end` when finished")
    view: str = Field(description="the dashboard's page for the job, with its progress bar")
    plan: str | None = Field(default=None, description="the stored plan, once a verify job is done")
    search: str | None = Field(default=None, description="the stored ranking, once a search job is done")


class JobRecord(BaseModel):
    id: str
    kind: str
    state: JobState
    progress: float = Field(description="0 to 1: the share of the job's stages finished")
    message: str = Field(description="what the job is doing now")
    result: dict[str, Any] | None = Field(
        default=None,
        description="a verify job's stored plan id (`plan_id`), a search job's stored search id (`search_id`)",
    )
    verify_not_run: VerifyNotRun | None = Field(
        default=None,
        description="a verify job done whose compiles did not run: why (its plan is stored all the same, at "
        "links.plan)",
    )
    error: str | None = Field(default=None, description="why a failed job failed")
    attempt: int = Field(description="1 for the first run; a job whose worker stopped runs again")
    created_at: float
    updated_at: float
    links: JobLinks

    @classmethod
    def of(cls, job: Job) -> JobRecord:
        plan_id, search_id = (job.result or {}).get("plan_id"), (job.result or {}).get("search_id")
        links = JobLinks(self=f"/jobs/{job.id}", events=f"/jobs/{job.id}/events", view=f"/jobs/{job.id}/view",
                         plan=f"/plans/{plan_id}" if plan_id else None,
                         search=f"/searches/{search_id}" if search_id else None)  # fmt: skip
        not_run = (job.result or {}).get("verify_not_run")
        return cls(id=job.id, kind=job.kind, state=job.state, progress=round(job.progress, 4),  # type: ignore[arg-type]
                   message=job.message, result=job.result, error=job.error, attempt=job.attempt,
                   verify_not_run=VerifyNotRun.model_validate(not_run) if not_run is not None else None,
                   created_at=job.created_at, updated_at=job.updated_at, links=links)  # fmt: skip


class JobList(BaseModel):
    items: list[JobRecord]
