"""From a request to a stored plan: the stored one when the same request came before."""

from __future__ import annotations

import zlib

from api.store import PlanStore, StoredPlan
from api.worker import JobFailed, PlanWorkers
from planner.errors import TOO_DEEP, HloParseError, PlannerError
from planner.hlo.text.parser import parse_hlo
from planner.plan.model import Plan
from planner.wire import PlanRecord, PlanRequest

_GZIP_MAGIC = b"\x1f\x8b"


def hlo_from_upload(data: bytes, limit: int) -> str:
    """Uploaded HLO, plain or gzip, as text; at most `limit` bytes once decompressed."""
    if data[:2] == _GZIP_MAGIC:
        inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        try:
            data = inflater.decompress(data, limit + 1)
        except zlib.error as e:
            raise JobFailed(422, f"the uploaded file looks gzip-compressed but does not decompress: {e}") from None
        if len(data) > limit or inflater.unconsumed_tail:
            raise JobFailed(413, f"the HLO text is larger than {limit:,} bytes once decompressed")
        if not inflater.eof:
            raise JobFailed(422, "the uploaded gzip file ends before its end-of-stream marker (cut short?)")
    elif len(data) > limit:
        raise JobFailed(413, f"the HLO text is larger than {limit:,} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise JobFailed(422, f"the HLO file is not UTF-8 text (byte {e.start} is 0x{data[e.start]:02x})") from None


def check_parses(request: PlanRequest) -> None:
    """Raises `JobFailed` (422, with the line and column) when the request's HLO does not parse: a job is
    refused at once, as POST /plan refuses it, instead of being accepted to fail minutes later."""
    try:
        parse_hlo(request.hlo, source=request.source)
    except HloParseError as e:
        raise JobFailed(422, str(e), e.line, e.column) from None
    except (PlannerError, ValueError) as e:
        raise JobFailed(422, str(e)) from None
    except RecursionError:
        raise JobFailed(422, TOO_DEEP) from None


def record(stored: StoredPlan, cached: bool) -> PlanRecord:
    return PlanRecord(
        id=stored.id, created_at=stored.created_at, cached=cached, plan=Plan.model_validate_json(stored.plan_json)
    )


async def plan_or_cached(request: PlanRequest, store: PlanStore, workers: PlanWorkers, limit: int) -> PlanRecord:
    """The stored plan of this request (`cached: true`), or a new one. Identical requests in flight at once
    are planned once: the others get the same plan, `cached: true`."""
    if len(request.hlo.encode()) > limit:
        raise JobFailed(413, f"the HLO text is larger than {limit:,} bytes")
    plan_id = request.content_hash()
    stored = store.get(plan_id)
    if stored is not None:
        return record(stored, cached=True)
    planned, joined = await workers.once(plan_id, lambda: _plan_and_store(plan_id, request, store, workers))
    return record(planned, cached=joined)


async def _plan_and_store(plan_id: str, request: PlanRequest, store: PlanStore, workers: PlanWorkers) -> StoredPlan:
    return store_answer(store, plan_id, await workers.run(request.job()))


def store_answer(store: PlanStore, plan_id: str, answer: dict) -> StoredPlan:
    """Stores a planner's answer (`api.plan_job`: the plan's JSON and the patched module) under `plan_id`."""
    plan = Plan.model_validate_json(answer["plan_json"])
    summary = {
        "module": plan.module,
        "mesh": plan.mesh,
        "capacity_bytes": plan.hbm.capacity_bytes,
        "total_before": plan.hbm.total_before,
        "total_after": plan.hbm.total_after,
        "num_findings": len(plan.findings),
        "chip": plan.verdict.chip if plan.verdict is not None else None,
        "verdict": plan.verdict.call_after if plan.verdict is not None else None,
    }
    return store.put(plan_id, answer["plan_json"], answer["patched"], summary)
