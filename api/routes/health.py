"""`/healthz` (the server answers and its store is readable) and `/readyz` (send it traffic)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from api.deps import StoreDep
from api.models import Health

router = APIRouter()


@router.get("/healthz", response_model=Health)
def healthz(store: StoreDep) -> Health:
    total, _ = store.recent(1, 0)
    return Health(stored_plans=total)


@router.get("/readyz", response_model=Health, responses={503: {"model": Health}})
def readyz(request: Request, store: StoreDep) -> JSONResponse:
    """Ready once started (planner processes warm, stalled jobs picked up) and while the store answers at
    its newest schema; 503 before, while stopping, or when the store does not answer."""
    try:
        total, _ = store.recent(1, 0)
        current = store.at_newest_revision()
    except Exception as e:
        return JSONResponse({"status": f"store: {type(e).__name__}: {e}", "stored_plans": 0}, status_code=503)
    if not getattr(request.app.state, "ready", False):
        return JSONResponse({"status": "starting or stopping", "stored_plans": total}, status_code=503)
    if not current:
        return JSONResponse({"status": "the store's schema is behind this server", "stored_plans": total},
                            status_code=503)  # fmt: skip
    return JSONResponse(Health(stored_plans=total).model_dump())
