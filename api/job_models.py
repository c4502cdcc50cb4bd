"""Request and response models of `/jobs`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from api.job_store import Job
from api.models import PlanRequest, RequestModel

JobState = Literal["queued", "running", "done", "failed"]


class SearchSpec(RequestModel):
    """What `spmd-planner search` takes, for a search job."""

    builder: str = Field(
        description="MODULE:FUNCTION of a step builder the service allows (SPMD_PLANNER_SEARCH_BUILDERS)"
    )
    devices: int = Field(ge=1, le=65536, description="chip count the meshes factor")
    axes: list[str] = Field(default=["fsdp", "tp"], min_length=1, description="mesh axis names, major to minor")
    remat: list[str] = Field(default=["none"], min_length=1, description="remat policies the builder knows")
    microbatches: list[int] = Field(default=[1], min_length=1, description="microbatch counts")
    chips: list[str] = Field(default=["v6e"], min_length=1, description="chip presets")
    top: int = Field(default=3, ge=0, le=16, description="how many of the best to compile")


class JobRequest(RequestModel):
    kind: Literal["verify", "search"] = Field(
        description="verify: plan the step, then compile it as given and with the plan's placements by real "
        "XLA (XLA:CPU, and XLA:TPU for a TPU chip when the service has libtpu); the plan is stored with the "
        "compiled numbers. search: plan every configuration of a step builder and compile the best "
        "(`spmd-planner search`); the ranking is stored as a search"
    )
    request: PlanRequest | None = Field(default=None, description="verify: what to plan, as for POST /plan")
    search: SearchSpec | None = Field(default=None, description="search: the builder and the grid")

    @model_validator(mode="after")
    def _one_payload(self) -> JobRequest:
        wanted = {"verify": "request", "search": "search"}[self.kind]
        if getattr(self, wanted) is None:
            raise ValueError(f"a {self.kind} job needs `{wanted}`")
        return self

    def payload(self) -> dict[str, Any]:
        """What the job row keeps: the part its kind reads."""
        part = self.request if self.kind == "verify" else self.search
        assert part is not None
        return part.model_dump(mode="json")


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
        return cls(id=job.id, kind=job.kind, state=job.state, progress=round(job.progress, 4),  # type: ignore[arg-type]
                   message=job.message, result=job.result, error=job.error, attempt=job.attempt,
                   created_at=job.created_at, updated_at=job.updated_at, links=links)  # fmt: skip


class JobList(BaseModel):
    items: list[JobRecord]
