"""The application: `create_app()` wires settings, the plan store, the workers and the routes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from api.docs import add_local_docs
from api.job_store import JobStore
from api.jobs import JobQueue
from api.limits import BodySizeLimit
from api.openapi_examples import example_for, service_examples
from api.rate_limit import RateLimit
from api.request_log import RequestLog
from api.routes import dashboard, health, jobs, plans, searches
from api.routes.plans import validation_message
from api.settings import Settings, get_settings, store_location
from api.store import PlanStore
from api.worker import JobFailed, PlanWorkers
from planner.wire import PlanRequest


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Planner processes are started before the first request needs one.
        await app.state.workers.warm_up()
        # Jobs left behind by a replica that stopped are picked up now, then every few seconds.
        app.state.jobs.start_watching()
        app.state.ready = True
        yield
        app.state.ready = False
        await app.state.jobs.close()
        await app.state.workers.close()
        app.state.store.close()

    app = FastAPI(
        lifespan=lifespan,
        title="SPMD sharding planner",
        version="0.1.0",
        description="Predicts which buffers XLA's GSPMD propagation leaves under-sharded, how much HBM each chip "
        "needs, and which sharding annotations fix it.",
        # Served below from local assets: the default pages load Swagger UI and ReDoc from a CDN,
        # which leaves them blank on a machine without internet access.
        docs_url=None,
        redoc_url=None,
    )
    add_local_docs(app)
    app.add_middleware(RequestLog, log_format=settings.log_format)
    app.state.settings = settings
    app.state.store = PlanStore(store_location(settings))
    app.state.jobs = JobQueue(JobStore(app.state.store), settings)
    app.state.rate_limit = RateLimit(settings.requests_per_minute)
    app.state.ready = False
    app.state.workers = PlanWorkers(settings.max_workers, settings.time_limit_seconds)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    if settings.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=settings.cors_origins, allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type"])  # fmt: skip

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, e: RequestValidationError) -> JSONResponse:
        # FastAPI's own answer is a list of errors; every other error here is `{"detail": "..."}`.
        return JSONResponse({"detail": validation_message(e.errors(), "request")}, status_code=422)

    @app.exception_handler(JobFailed)
    async def job_failed(request: Request, e: JobFailed) -> JSONResponse:
        return JSONResponse({"detail": e.message, "line": e.line, "column": e.column}, status_code=e.status)

    app.include_router(health.router)
    app.include_router(plans.router)
    app.include_router(searches.router)
    app.include_router(jobs.router)
    app.include_router(dashboard.router)
    app.openapi = lambda: _openapi_with(app, PlanRequest)  # type: ignore[method-assign]
    return app


def _openapi_with(app: FastAPI, *models: type[BaseModel]) -> dict[str, Any]:
    """The generated schema plus models that routes read by hand (POST /plan takes JSON or a form)."""
    if app.openapi_schema is None:
        schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for model in models:
            generated = model.model_json_schema(ref_template="#/components/schemas/{model}")
            components.update(generated.pop("$defs", {}))
            components[model.__name__] = generated
        examples = service_examples()
        for name, component in components.items():
            example = examples.get(name, example_for(name))
            if example is not None and "examples" not in component:
                component["examples"] = [example]
        app.openapi_schema = schema
    return app.openapi_schema
