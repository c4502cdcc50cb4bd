"""`/healthz`: the server answers and its plan store is readable."""

from __future__ import annotations

from fastapi import APIRouter

from api.deps import StoreDep
from api.models import Health

router = APIRouter()


@router.get("/healthz", response_model=Health)
def healthz(store: StoreDep) -> Health:
    total, _ = store.recent(1, 0)
    return Health(stored_plans=total)
