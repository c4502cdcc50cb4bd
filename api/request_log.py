"""One log line per request: method, path, status, milliseconds, and for plans their id and cache use.

Routes that serve a plan say which through `request.state` (`plan_id`, `cached`); the line is
written when the response starts, on the `spmd_planner.api` logger.
"""

from __future__ import annotations

import logging
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("spmd_planner.api")


class RequestLog:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def logged_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, logged_send)
        finally:
            state = scope.get("state", {})
            extra = ""
            if "plan_id" in state:
                extra = f" plan={state['plan_id']} cached={str(state.get('cached', False)).lower()}"
            ms = (time.perf_counter() - start) * 1000
            log.info("%s %s %d %.1f ms%s", scope["method"], scope["path"], status, ms, extra)
