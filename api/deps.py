"""Dependencies of the routes, as `Annotated` aliases."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, HTTPException, Request

from api.settings import Settings, get_settings
from api.store import PlanStore
from api.worker import PlanWorkers


def _store(request: Request) -> PlanStore:
    return request.app.state.store  # type: ignore[no-any-return]


def _workers(request: Request) -> PlanWorkers:
    return request.app.state.workers  # type: ignore[no-any-return]


def _settings(request: Request) -> Settings:
    return getattr(request.app.state, "settings", None) or get_settings()


SettingsDep = Annotated[Settings, Depends(_settings)]
StoreDep = Annotated[PlanStore, Depends(_store)]
WorkersDep = Annotated[PlanWorkers, Depends(_workers)]


def token_ok(settings: Settings, presented: str | None) -> bool:
    """Constant-time check of a bearer token; with no token configured every caller may post."""
    if settings.token is None:
        return True
    return presented is not None and hmac.compare_digest(presented.encode(), settings.token.encode())


def require_token(request: Request, settings: SettingsDep) -> None:
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if not token_ok(settings, value.strip() if scheme.lower() == "bearer" else None):
        raise HTTPException(401, "a valid bearer token is required to post plans", {"WWW-Authenticate": "Bearer"})


AuthDep = Annotated[None, Depends(require_token)]
