"""E2B's wire protocol under `/e2b` (SPEC §14): its control API and its in-sandbox API, as one
table of operations that the router's app serves with its own (so the façade is in
/openapi.json, and so in the fuzzer).

One origin serves both, as `E2B_API_URL` and `E2B_SANDBOX_URL` point at it: `/sandboxes...`
and `/v2/sandboxes...` are the control API (`X-API-KEY`, control/), every other path is
envd's or the code interpreter's (the sandbox's `X-Access-Token`, envd/app.py), told apart by
path, not by the `E2b-Sandbox-Id` header, which some SDK versions also send to the control
API. Each table wraps its handlers once with its authentication and its error shape.
`NOT_SERVED`, after the table, answers every other path under /e2b in E2B's shape as well:
the SDK raises its own exceptions for a path or method sandcell does not serve.

`ROOT_OPERATIONS` are served at the server's root: the SDK's signed file URLs, which
`urljoin` takes out of `/e2b` (signed.py).
"""

from __future__ import annotations

from dataclasses import replace

from starlette.requests import Request
from starlette.routing import Match, Route
from starlette.types import Receive, Scope, Send

from sandcell.compat.e2b import control, errors, signed
from sandcell.compat.e2b.envd import app as envd
from sandcell.errors import ErrorCode, ServiceError
from sandcell.http.openapi import routes

PREFIX = "/e2b"
OPERATIONS = tuple(
    replace(op, path=PREFIX + op.path) for op in (*control.OPERATIONS, *envd.OPERATIONS)
)
ROOT_OPERATIONS = signed.OPERATIONS
SECURITY_SCHEMES = {"e2bApiKey": control.SCHEME, **envd.SCHEMES, "e2bFileSignature": signed.SCHEME}
CONNECT_PATHS = ("/process.", "/filesystem.")


class _NotServed:
    """Any method on any path under /e2b that the table does not serve: a 405 (with
    `Allow`) for a path it serves with other methods, else a 404 (Connect's `unimplemented`
    for an unknown procedure); Connect-shaped under a Connect service, else E2B's REST."""

    def __init__(self) -> None:
        self.served = routes(OPERATIONS)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        path = scope["path"][len(scope.get("root_path", "")) + len(PREFIX) :] or "/"
        allowed = sorted(
            method
            for route in self.served
            if route.matches(scope)[0] is Match.PARTIAL
            for method in route.methods or ()
        )
        message = f"{request.method} {path} is not served"
        if allowed:
            error = ServiceError(
                ErrorCode.METHOD_NOT_ALLOWED, message, headers={"Allow": ", ".join(allowed)}
            )
        elif path.startswith(CONNECT_PATHS):
            error = ServiceError(ErrorCode.NOT_IMPLEMENTED, f"{message} by sandcell")
        else:
            error = ServiceError(ErrorCode.NOT_FOUND, message)
        shape = errors.connect_unary_error if path.startswith(CONNECT_PATHS) else errors.rest_error
        await shape(error)(scope, receive, send)


_not_served = _NotServed()
NOT_SERVED = (
    Route(PREFIX, _not_served),
    Route(PREFIX + "/{path:path}", _not_served),
    signed.NOT_SERVED,
)

__all__ = ["NOT_SERVED", "OPERATIONS", "PREFIX", "ROOT_OPERATIONS", "SECURITY_SCHEMES"]
