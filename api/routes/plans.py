"""`/plan` and `/plans`: make a plan, read stored ones."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import ValidationError
from starlette.datastructures import UploadFile

from api.deps import AuthDep, SettingsDep, StoreDep, WorkersDep
from api.models import ErrorDetail, PlanPage, PlanSummary
from api.planning import hlo_from_upload, plan_or_cached, record
from api.worker import JobFailed
from planner.memory import parse_byte_count
from planner.memory.chips import check_hbm_bytes
from planner.mesh import Mesh
from planner.wire import REQUEST_SOURCE, MeshSpec, PlanRecord, PlanRequest

router = APIRouter()
EveryChip = Annotated[
    bool,
    Query(description="bytes per chip one entry per chip (default: one entry per distinct value, its chips as ranges)"),
]

_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorDetail, "description": "a bearer token is configured and was not given"},
    413: {"model": ErrorDetail, "description": "body or HLO text over the size limit"},
    422: {"model": ErrorDetail, "description": "HLO that does not parse (with line and column), or settings "
                                               "that do not fit the module"},
    415: {"model": ErrorDetail, "description": "no body, or a body neither application/json nor a form"},
    500: {"model": ErrorDetail, "description": "the planner process died (the server keeps serving)"},
    504: {"model": ErrorDetail, "description": "planning took longer than the time limit"},
}  # fmt: skip

_UPLOAD_SCHEMA = {
    "multipart/form-data": {
        "schema": {
            "type": "object",
            "required": ["hlo_file"],
            "properties": {
                "hlo_file": {"type": "string", "format": "binary", "description": "HLO text, plain or gzip"},
                "mesh": {"type": "string", "example": "fsdp=4,tp=2"},
                "chip": {"type": "string", "example": "v6e"},
                "hbm_bytes": {"type": "string", "example": "32GiB"},
                "manifest": {"type": "string", "description": "the manifest as JSON text"},
                "threshold": {"type": "number"},
                "min_bytes": {"type": "string"},
                "verify": {"type": "boolean"},
            },
        }
    },
    "application/json": {"schema": {"$ref": "#/components/schemas/PlanRequest"}},
}


@router.post(
    "/plan",
    response_model=PlanRecord,
    responses=_ERRORS,
    summary="Plan a training step",
    description="HLO text in JSON (`PlanRequest`), or an uploaded HLO file (plain or gzip) with the other fields "
    "as form values. The same request returns the stored plan without recomputing it (`cached: true`).",
    openapi_extra={"requestBody": {"required": True, "content": _UPLOAD_SCHEMA}},
)
async def post_plan(
    request: Request, _: AuthDep, settings: SettingsDep, store: StoreDep, workers: WorkersDep,
    every_chip: EveryChip = False,
) -> PlanRecord | JSONResponse:  # fmt: skip
    plan_request = await read_plan_request(request, settings.max_body_bytes)
    planned = await plan_or_cached(plan_request, store, workers, settings.max_body_bytes)
    request.state.plan_id, request.state.cached = planned.id, planned.cached  # for the request log
    return _answer(planned, every_chip)


def _answer(planned: PlanRecord, every_chip: bool) -> PlanRecord | JSONResponse:
    """The record, its bytes per chip grouped by value; with `every_chip`, one entry per chip."""
    if not every_chip:
        return planned
    return JSONResponse(planned.model_dump(mode="json", context={"every_chip": True}))


async def read_plan_request(request: Request, limit: int) -> PlanRequest:
    """JSON body or multipart form, validated into one `PlanRequest`."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    try:
        if kind in ("multipart/form-data", "application/x-www-form-urlencoded"):
            return await _from_form(request, limit)
        if kind == "application/json":
            return PlanRequest.model_validate_json(await request.body())
        # A body without a content type is read as JSON; no body at all is answered 415 below.
        if kind == "" and (body := await request.body()):
            return PlanRequest.model_validate_json(body)
    except ValidationError as e:
        raise HTTPException(422, validation_message(e.errors())) from None
    except JobFailed:
        raise
    except ValueError as e:
        raise HTTPException(422, str(e)) from None
    if kind == "":
        raise HTTPException(415, "the request has no body: send the plan request as application/json, or the HLO "
                            "file as multipart/form-data (field `hlo_file`)")  # fmt: skip
    raise HTTPException(415, f"send application/json or multipart/form-data, not {kind!r}")


async def _from_form(request: Request, limit: int) -> PlanRequest:
    form = await request.form(max_part_size=limit)
    upload = form.get("hlo_file")
    # A browser sends an empty, nameless file part for a file input left alone: that is no file.
    data = await upload.read(limit + 1) if isinstance(upload, UploadFile) else b""
    pasted = form.get("hlo") if isinstance(form.get("hlo"), str) else ""
    if data and str(pasted).strip():
        raise ValueError("the form has both an HLO file and pasted HLO text: give one")
    if data:
        hlo, source = hlo_from_upload(data, limit), _file_name(upload)
    elif str(pasted).strip():
        hlo, source = str(pasted), REQUEST_SOURCE
    else:
        raise ValueError("the form needs the HLO as a file field `hlo_file` (or text field `hlo`)")
    fields: dict[str, Any] = {"hlo": hlo, "options": {}}
    if text := _text(form, "mesh"):
        mesh = Mesh.parse(text)
        fields["mesh"] = MeshSpec(shape=list(mesh.shape), axis_names=list(mesh.axis_names))
    # Form values are typed by people: byte counts take a unit, as on the command line (a bare `32` is
    # refused, not read as 32 bytes). JSON's `*_bytes` fields take plain integers.
    if text := _text(form, "chip"):
        # One box takes a preset name or a byte count (the dashboard's form has one).
        fields["hbm_bytes" if text[0].isdigit() else "chip"] = _hbm(text) if text[0].isdigit() else text
    if text := _text(form, "libtpu"):
        fields["libtpu"] = text
    if text := _text(form, "hbm_bytes"):
        fields["hbm_bytes"] = _hbm(text)
    if text := _text(form, "manifest"):
        fields["manifest"] = json.loads(text)
    if text := _text(form, "threshold"):
        fields["options"]["threshold"] = float(text)
    if text := _text(form, "min_bytes"):
        fields["options"]["min_bytes"] = parse_byte_count(text)
    if text := _text(form, "verify"):
        fields["options"]["verify"] = text.lower() in ("1", "true", "on", "yes")
    return PlanRequest.model_validate(fields).named(source)


def _text(form: Any, key: str) -> str | None:
    value = form.get(key)
    return value.strip() or None if isinstance(value, str) else None


def _file_name(upload: Any) -> str:
    """How messages name an uploaded file (`mydump.hlo:3:5: ...`): its name, without the folders a
    browser may send with it."""
    name = upload.filename if isinstance(upload, UploadFile) else None
    return (name or "").replace("\\", "/").rsplit("/", 1)[-1] or "hlo_file"


def _hbm(text: str) -> int:
    """HBM per chip typed in a form (`32GiB`); one no chip has is refused, quoting what was typed."""
    return check_hbm_bytes(parse_byte_count(text), text)


def validation_message(errors: Sequence[Any], whole: str = "body") -> str:
    """The first of pydantic's (or FastAPI's) validation errors, located: `mesh.shape: ... (and 2 more)`;
    `whole` names the place of an error located nowhere deeper."""
    first = errors[0] if errors else {"loc": (), "msg": "invalid"}
    where = ".".join(str(x) for x in first["loc"]) or whole
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{where}: {first['msg']}{more}"


@router.get("/plans/{plan_id}", response_model=PlanRecord, responses={404: {"model": ErrorDetail}})
def get_plan(plan_id: str, store: StoreDep, every_chip: EveryChip = False) -> PlanRecord | JSONResponse:
    stored = store.get(plan_id)
    if stored is None:
        raise HTTPException(404, f"no plan {plan_id!r}")
    return _answer(record(stored, cached=True), every_chip)


@router.get(
    "/plans/{plan_id}/patched.hlo",
    response_class=PlainTextResponse,
    responses={404: {"model": ErrorDetail}},
    summary="The module with the recommended placements applied, as HLO text",
)
def get_patched(plan_id: str, store: StoreDep) -> PlainTextResponse:
    text = store.patched_hlo(plan_id)
    if text is None:
        raise HTTPException(404, f"no plan {plan_id!r}")
    return PlainTextResponse(text)


@router.get("/plans", response_model=PlanPage, summary="Recent plans, newest first")
def list_plans(
    store: StoreDep,
    settings: SettingsDep,
    limit: int | None = Query(default=None, ge=1, le=500),
    offset: int = Query(default=0, ge=0),
) -> PlanPage:
    limit = limit or settings.page_size
    total, rows = store.recent(limit, offset)
    items = [PlanSummary(**{k: getattr(r, k) for k in PlanSummary.model_fields}) for r in rows]
    return PlanPage(total=total, limit=limit, offset=offset, items=items)
