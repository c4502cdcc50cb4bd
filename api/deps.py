"""Dependencies of the routes, as `Annotated` aliases."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, HTTPException, Request

from api.jobs import JobQueue
from api.rate_limit import RateLimit, caller_of
from api.settings import Settings, get_settings
from api.store import PlanStore
from api.worker import PlanWorkers


def _store(request: Request) -> PlanStore:
    return request.app.state.store  # type: ignore[no-any-return]


def _workers(request: Request) -> PlanWorkers:
    return request.app.state.workers  # type: ignore[no-any-return]


def _jobs(request: Request) -> JobQueue:
    return request.app.state.jobs  # type: ignore[no-any-return]


def _settings(request: Request) -> Settings:
    return getattr(request.app.state, "settings", None) or get_settings()


SettingsDep = Annotated[Settings, Depends(_settings)]
StoreDep = Annotated[PlanStore, Depends(_store)]
WorkersDep = Annotated[PlanWorkers, Depends(_workers)]
JobsDep = Annotated[JobQueue, Depends(_jobs)]


def token_ok(settings: Settings, presented: str | None) -> bool:
    """Constant-time check of a bearer token; with no token configured every caller may post."""
    if settings.token is None:
        return True
    return presented is not None and hmac.compare_digest(presented.encode(), settings.token.encode())


def bearer(request: Request) -> str | None:
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" else None


def require_token(request: Request, settings: SettingsDep) -> str:
    """The caller (see `rate_limit.caller_of`), once its token passes and its rate allows one more POST."""
    presented = bearer(request)
    if not token_ok(settings, presented):
        raise HTTPException(401, "a valid bearer token is required to post plans", {"WWW-Authenticate": "Bearer"})
    caller = caller_of(presented)
    limit: RateLimit | None = getattr(request.app.state, "rate_limit", None)
    wait = limit.take(caller) if limit is not None else None
    if wait is not None:
        raise HTTPException(429, f"rate limit: {settings.requests_per_minute} requests a minute per token; "
                            f"retry in {wait:.1f} s", {"Retry-After": str(max(1, round(wait)))})  # fmt: skip
    return caller


AuthDep = Annotated[str, Depends(require_token)]
