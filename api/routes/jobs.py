"""`/jobs`: verify and search runs that outlive a request, with progress to poll, stream or watch."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse

from api.deps import AuthDep, JobsDep, SettingsDep
from api.job_models import JobList, JobRecord
from api.job_start import start_job
from api.job_store import FINISHED
from api.models import ErrorDetail
from api.routes.dashboard import not_found, templates
from planner.wire import JobRequest

router = APIRouter()
# How often an event stream looks at the job's row (any replica may be the one writing it).
POLL_SECONDS = 0.5
# A comment line this often keeps proxies from closing a quiet stream.
KEEPALIVE_SECONDS = 15.0


_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorDetail},
    422: {"model": ErrorDetail, "description": "a body that does not validate, or HLO that does not parse (with "
                                               "line and column)"},
    429: {"model": ErrorDetail},
}  # fmt: skip


@router.post("/jobs", status_code=202, response_model=JobRecord, responses=_ERRORS,
             summary="Start a verify or search job; answers at once with its id")  # fmt: skip
def post_job(body: JobRequest, caller: AuthDep, jobs: JobsDep, settings: SettingsDep) -> JSONResponse:
    record = JobRecord.of(start_job(body, caller, jobs, settings))
    return JSONResponse(record.model_dump(mode="json"), status_code=202, headers={"Location": record.links.self})


def _found(jobs: JobsDep, job_id: str) -> JobRecord:
    job = jobs.jobs.get(job_id)
    if job is None:
        raise HTTPException(404, f"no job {job_id!r}")
    return JobRecord.of(job)


@router.get("/jobs", response_model=JobList, summary="Recent jobs, newest first")
def list_jobs(jobs: JobsDep, settings: SettingsDep) -> JobList:
    return JobList(items=[JobRecord.of(j) for j in jobs.jobs.recent(settings.page_size)])


@router.get("/jobs/{job_id}", response_model=JobRecord, responses={404: {"model": ErrorDetail}},
            summary="A job's state, progress and result")  # fmt: skip
def get_job(job_id: str, jobs: JobsDep) -> JobRecord:
    return _found(jobs, job_id)


@router.get("/jobs/{job_id}/events", responses={404: {"model": ErrorDetail}},
            summary="A job's progress as server-sent events")  # fmt: skip
async def job_events(job_id: str, jobs: JobsDep) -> StreamingResponse:
    _found(jobs, job_id)
    return StreamingResponse(_events(jobs, job_id), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})  # fmt: skip


async def _events(jobs: JobsDep, job_id: str) -> AsyncIterator[str]:
    """`progress` whenever the row changes, then `end` with the final record."""
    last = None
    quiet = 0.0
    while True:
        record = await asyncio.to_thread(_found, jobs, job_id)
        seen = (record.state, record.progress, record.message, record.attempt)
        data = json.dumps(record.model_dump(mode="json"))
        if record.state in FINISHED:
            yield f"event: end\ndata: {data}\n\n"
            return
        if seen != last:
            last, quiet = seen, 0.0
            yield f"event: progress\ndata: {data}\n\n"
        elif quiet >= KEEPALIVE_SECONDS:
            quiet = 0.0
            yield ": still running\n\n"
        await asyncio.sleep(POLL_SECONDS)
        quiet += POLL_SECONDS


@router.get("/jobs/{job_id}/view", response_class=HTMLResponse, include_in_schema=False)
def view_job(request: Request, job_id: str, jobs: JobsDep) -> HTMLResponse:
    job = jobs.jobs.get(job_id)
    if job is None:
        return not_found(request, "job", job_id)
    return templates.TemplateResponse(request, "job.html", {"job": JobRecord.of(job)})


@router.get("/recent-jobs", response_class=HTMLResponse, include_in_schema=False)
def view_jobs(request: Request, jobs: JobsDep, settings: SettingsDep) -> HTMLResponse:
    """Recent jobs, newest first, each linking its page and what it made (a plan or a ranking)."""
    records = [JobRecord.of(j) for j in jobs.jobs.recent(settings.page_size)]
    return templates.TemplateResponse(request, "jobs.html", {"jobs": records})
