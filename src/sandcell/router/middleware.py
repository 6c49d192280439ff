"""Per-request context: a request id, the in-flight bound, what the request holds at the
door, metrics and the access log.

Plain ASGI (no BaseHTTPMiddleware), so streamed bodies pass through untouched. The health
probes are answered whatever the in-flight bound says: a flood of other requests must not
make a healthy router look dead to its supervisor.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import secrets
import time
from typing import TYPE_CHECKING, Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sandcell import telemetry
from sandcell.audit.trail import CALLER
from sandcell.errors import ErrorCode, error_body
from sandcell.http.errors import CLIENT_CLOSED
from sandcell.logs import printable
from sandcell.router.door import HOLDS, PAYER

if TYPE_CHECKING:
    from sandcell.router.app import Router

log = logging.getLogger("sandcell.access")
REQUEST_ID = b"x-request-id"
# Echoed in a response header and logged: visible ASCII only.
CLIENT_REQUEST_ID = re.compile(rb"[\x21-\x7e]{1,128}")
PROBES = frozenset({"/healthz", "/readyz"})


class RequestContext:
    def __init__(self, app: ASGIApp, router: Router) -> None:
        self.app = app
        self.router = router
        self.inflight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # A request's task may start in the context of the one before it on its connection
        # (uvicorn starts a pipelined request from the last one's response): who called then
        # is not who calls now.
        CALLER.set(None)
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = _request_id(scope)
        metrics = self.router.metrics
        if self.inflight >= self.router.limits.max_inflight and scope["path"] not in PROBES:
            await _overloaded(send, request_id)
            metrics.requests.labels("overloaded", scope["method"], "503").inc()
            return
        started = time.perf_counter()
        status = 500

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", []), (REQUEST_ID, request_id)]
            await send(message)

        tracing = telemetry.active  # SPEC §20: off, this None check is all it costs
        span = tracing.request(scope) if tracing is not None else None
        self.inflight += 1
        metrics.inflight.inc()
        try:
            with contextlib.ExitStack() as holds:
                scope[HOLDS] = holds
                await self.app(scope, receive, send_with_id)
        finally:
            self.inflight -= 1
            metrics.inflight.dec()
            route = _route_name(scope)
            elapsed = time.perf_counter() - started
            if span is not None:
                span.finish(scope, route, status, scope.get(PAYER))
            metrics.requests.labels(route, scope["method"], str(status)).inc()
            metrics.latency.labels(route).observe(elapsed)
            log.info(
                "%s %s %s%s",
                printable(scope["method"]),
                printable(scope["path"]),
                status,
                " client disconnected" if status == CLIENT_CLOSED else "",
                extra={
                    "request_id": request_id.decode(),
                    "status": status,
                    "route": route,
                    "duration_ms": round(elapsed * 1000, 3),
                },
            )


def _request_id(scope: Scope) -> bytes:
    for name, value in scope.get("headers", []):
        if name == REQUEST_ID and CLIENT_REQUEST_ID.fullmatch(value):
            return value
    return secrets.token_hex(8).encode()


def _route_name(scope: Scope) -> str:
    route: Any = scope.get("route")
    return getattr(route, "path", "unmatched")


async def _overloaded(send: Send, request_id: bytes) -> None:
    body = json.dumps(error_body(ErrorCode.OVERLOADED, "too many requests in flight")).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 503,
            "headers": [
                (b"content-type", b"application/json"),
                (b"retry-after", b"1"),
                (REQUEST_ID, request_id),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
