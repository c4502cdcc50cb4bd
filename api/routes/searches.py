"""`/searches`: configuration-search reports, stored and drawn (`spmd-planner search --url` posts them)."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse

from api.deps import AuthDep, StoreDep
from api.models import ErrorDetail
from api.routes.dashboard import not_found, templates
from api.search_view import compiled_against_predicted, search_chart
from planner.wire import SearchRecord, SearchReportBody

router = APIRouter()


@router.post("/searches", response_model=SearchRecord, responses={401: {"model": ErrorDetail}},
             summary="Store a configuration search's ranking")  # fmt: skip
def post_search(report: SearchReportBody, _: AuthDep, store: StoreDep) -> SearchRecord:
    search_id = report.content_hash()
    created = store.put_search(search_id, report.model_dump_json())
    return SearchRecord(id=search_id, created_at=created, report=report)


def _stored(store: StoreDep, search_id: str) -> SearchRecord | None:
    found = store.get_search(search_id)
    if found is None:
        return None
    created, report = found
    return SearchRecord(id=search_id, created_at=created, report=SearchReportBody.model_validate_json(report))


@router.get("/searches/{search_id}", response_model=SearchRecord, responses={404: {"model": ErrorDetail}},
            summary="A stored search's ranking")  # fmt: skip
def get_search(search_id: str, store: StoreDep) -> SearchRecord:
    record = _stored(store, search_id)
    if record is None:
        raise HTTPException(404, f"no search {search_id!r}")
    return record


@router.get("/searches/{search_id}/view", response_class=HTMLResponse, include_in_schema=False)
def view_search(request: Request, search_id: str, store: StoreDep) -> HTMLResponse:
    record = _stored(store, search_id)
    if record is None:
        return not_found(request, "search", search_id)
    context = {
        "record": record,
        "rows": record.report.rows,
        "chart": search_chart(record.report.rows),
        "against": compiled_against_predicted,
    }
    return templates.TemplateResponse(request, "search.html", context)
