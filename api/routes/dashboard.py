"""The dashboard: recent plans with a form (`/`), and one plan drawn (`/plans/{id}/view`).

Server-rendered HTML with inline SVG and no external resources, so it works
offline. Templates autoescape: names and metadata from user HLO are text,
never markup.
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.templating import Jinja2Templates
from pydantic import ValidationError

from api.deps import JobsDep, SettingsDep, StoreDep, WorkersDep, token_ok
from api.job_start import start_job
from api.jobs import JobQueue
from api.planning import plan_or_cached
from api.rate_limit import caller_of
from api.routes.plans import read_plan_request, validation_message
from api.settings import Settings
from api.split_svg import finding_split_svg, root_cause_svg
from api.timeline_view import timelines
from api.views import breakdown_rows, change_set, hbm_chart, human_bytes, mesh_grid, placement_code, placement_text
from api.worker import JobFailed
from planner.plan.chip_groups import chip_groups
from planner.plan.model import Plan
from planner.wire import JobRequest, PlanRequest

router = APIRouter(include_in_schema=False)
templates = Jinja2Templates(directory=Path(__file__).resolve().parents[1] / "templates")
templates.env.autoescape = True
templates.env.globals.update(
    human=human_bytes, when=lambda t: datetime.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M")
)


def _index(request: Request, store: Any, settings: Any, offset: int, error: str | None = None,
           form: dict[str, str] | None = None, status: int = 200) -> HTMLResponse:  # fmt: skip
    total, plans = store.recent(settings.page_size, offset)
    context = {"plans": plans, "total": total, "offset": offset, "limit": settings.page_size, "error": error,
               "form": form or {}, "token_required": settings.token is not None}  # fmt: skip
    return templates.TemplateResponse(request, "index.html", context, status_code=status)


@router.get("/", response_class=HTMLResponse)
def index(request: Request, store: StoreDep, settings: SettingsDep, offset: int = 0) -> HTMLResponse:
    return _index(request, store, settings, max(offset, 0))


@router.post("/", response_model=None)
async def submit(
    request: Request, store: StoreDep, settings: SettingsDep, workers: WorkersDep, jobs: JobsDep
) -> HTMLResponse | RedirectResponse:
    """The form: plan, then show the plan; or, with its Verify button, start a verify job and show its
    progress; on bad input, the form again with the message."""
    form = await request.form(max_part_size=settings.max_body_bytes)
    # What the user typed comes back with the message, pasted HLO included (an uploaded file cannot be).
    echo = {k: value for k in ("hlo", "mesh", "chip", "manifest") if isinstance(value := form.get(k), str)}
    token = str(form.get("token") or "") or None
    if not token_ok(settings, token):
        return _index(request, store, settings, 0, "a valid token is required to plan", echo, 401)
    try:
        plan_request = await read_plan_request(request, settings.max_body_bytes)
        if form.get("action") == "verify":
            return _start_verify(plan_request, jobs, settings, caller_of(token))
        record = await plan_or_cached(plan_request, store, workers, settings.max_body_bytes)
    except HTTPException as e:
        return _index(request, store, settings, 0, str(e.detail), echo, e.status_code)
    except JobFailed as e:
        return _index(request, store, settings, 0, e.message, echo, e.status)
    except ValidationError as e:
        return _index(request, store, settings, 0, validation_message(e.errors()), echo, 422)
    return RedirectResponse(f"/plans/{record.id}/view", status_code=303)


def _start_verify(plan_request: PlanRequest, jobs: JobQueue, settings: Settings, caller: str) -> RedirectResponse:
    """A verify job for the form's step (the compilers take minutes), started as POST /jobs starts one: its
    page shows the progress, then links to the verified plan."""
    job = start_job(JobRequest(kind="verify", request=plan_request), caller, jobs, settings)
    return RedirectResponse(f"/jobs/{job.id}/view", status_code=303)


def not_found(request: Request, what: str, item_id: str) -> HTMLResponse:
    """A page (404) for a plan, job or search id nothing is stored under, linking back to the dashboard:
    the JSON endpoints answer their own 404 with `{"detail": ...}`."""
    return templates.TemplateResponse(request, "not_found.html", {"what": what, "item_id": item_id},
                                      status_code=404)  # fmt: skip


@router.get("/plans/{plan_id}/view", response_class=HTMLResponse)
def view(request: Request, plan_id: str, store: StoreDep) -> HTMLResponse:
    stored = store.get(plan_id)
    if stored is None:
        return not_found(request, "plan", plan_id)
    plan = Plan.model_validate_json(stored.plan_json)
    context = {
        "plan": plan,
        "plan_id": plan_id,
        "chart": hbm_chart(plan),
        "groups": chip_groups(plan),
        "grid": mesh_grid(plan),
        "timelines": timelines(plan),
        "change_set": change_set(plan),
        "breakdown": breakdown_rows(plan),
        "placement_text": lambda i: placement_text(plan, i),
        "placement_code": lambda i: placement_code(plan, i),
        "finding_split": finding_split_svg,
        "cause_split": root_cause_svg,
    }
    return templates.TemplateResponse(request, "plan.html", context)
