"""One log line per request: method, path, status, milliseconds, and for plans their id and cache use.

Routes that serve a plan say which through `request.state` (`plan_id`, `cached`); the line is
written when the response starts, on the `spmd_planner.api` logger.

Every answer carries `X-Request-ID` (the caller's, when it sent a plain one; else a new one), and
its line names it (`request=...`), so a user's report finds its line in any replica's log.

One request is one line whatever its path holds: the path is URL-decoded by the server, so
`/plans/x%0A...` reaches here with a newline that would start a second, forged line, and `%00` a raw
NUL. Text lines write control characters as escapes (`\\n`, `\\x00`, `\\x7f`); JSON lines
(`SPMD_PLANNER_LOG_FORMAT=json`) escape them as JSON does, one object a line:

    GET /plans/x\\n2026-01-01 POST /plan 404 0.4 ms
    {"method": "GET", "path": "/plans/x\\n2026-01-01 POST /plan", "status": 404, "ms": 0.4}
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from typing import Any, Literal

from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("spmd_planner.api")

LogFormat = Literal["text", "json"]
_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\\": "\\\\"}


def escaped(text: str) -> str:
    """`text` with every control character (C0, DEL, C1) and backslash written as an escape: one printable line."""
    out = []
    for ch in text:
        code = ord(ch)
        if ch in _NAMED_ESCAPES:
            out.append(_NAMED_ESCAPES[ch])
        elif code < 0x20 or 0x7F <= code < 0xA0 or ch in "\u2028\u2029":
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
        else:
            out.append(ch)
    return "".join(out)


def log_line(fields: dict[str, Any], log_format: LogFormat) -> str:
    """The request's line: `METHOD PATH STATUS MS ms [plan=ID cached=BOOL]`, or one JSON object."""
    if log_format == "json":
        return json.dumps(fields, ensure_ascii=True)
    extra = ""
    if "plan_id" in fields:
        extra = f" plan={escaped(str(fields['plan_id']))} cached={str(fields['cached']).lower()}"
    if "request_id" in fields:
        extra += f" request={fields['request_id']}"
    return f"{escaped(fields['method'])} {escaped(fields['path'])} {fields['status']} {fields['ms']:.1f} ms{extra}"


_REQUEST_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")


def _request_id(scope: Scope) -> str:
    """The caller's `X-Request-ID` when it is a plain token (a load balancer's), else a new one."""
    for key, value in scope.get("headers", []):
        if key == b"x-request-id":
            text = value.decode("latin-1")
            if _REQUEST_ID.fullmatch(text):
                return text
    return uuid.uuid4().hex


class RequestLog:
    def __init__(self, app: ASGIApp, log_format: LogFormat = "text") -> None:
        self.app = app
        self.log_format = log_format

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500
        request_id = _request_id(scope)

        async def logged_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message = {**message, "headers": [*message.get("headers", []), (b"x-request-id", request_id.encode())]}
            await send(message)

        try:
            await self.app(scope, receive, logged_send)
        finally:
            state = scope.get("state", {})
            fields: dict[str, Any] = {
                "method": scope["method"],
                "path": scope["path"],
                "status": status,
                "ms": round((time.perf_counter() - start) * 1000, 1),
                "request_id": request_id,
            }
            if "plan_id" in state:
                fields.update(plan_id=state["plan_id"], cached=bool(state.get("cached", False)))
            log.info("%s", log_line(fields, self.log_format))
