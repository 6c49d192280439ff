"""E2B's wire protocol under `/e2b` (SPEC §14): its control API and its in-sandbox API.

One origin serves both, as `E2B_API_URL` and `E2B_SANDBOX_URL` point at it: `/sandboxes...`
and `/v2/sandboxes...` are the control API, every other path is envd's (told apart by path, not
by the `E2b-Sandbox-Id` header, which some SDK versions also send to the control API).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount
from starlette.types import Receive, Scope, Send

from sandcell.compat.e2b import errors
from sandcell.compat.e2b.control import Control
from sandcell.compat.e2b.envd import app as envd
from sandcell.compat.e2b.gateway import Gateway
from sandcell.errors import ErrorCode, SandcellError

PREFIX = "/e2b"
_ID = r"(?P<sandbox_id>[^/]+)"
CONTROL_PATHS = re.compile(r"/(v2/)?sandboxes(/|$)")
ControlRoute = tuple[str, re.Pattern[str], Callable[..., Awaitable[Response]]]


def _routes(control: Control) -> list[ControlRoute]:
    table = [
        ("POST", r"/(v2/)?sandboxes", control.create),
        ("GET", r"/(v2/)?sandboxes", control.list),
        ("GET", rf"/sandboxes/{_ID}", control.describe),
        ("DELETE", rf"/sandboxes/{_ID}", control.kill),
        ("POST", rf"/sandboxes/{_ID}/timeout", control.set_timeout),
        ("POST", rf"/(v2/)?sandboxes/{_ID}/connect", control.connect),
        ("GET", rf"/sandboxes/{_ID}/metrics", control.metrics),
        ("POST", rf"/sandboxes/{_ID}/pause", control.pause),
        ("POST", rf"/sandboxes/{_ID}/resume", control.resume),
    ]
    return [(method, re.compile(pattern + "$"), fn) for method, pattern, fn in table]


class E2bFacade:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.routes = _routes(Control(gateway))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        path = scope["path"][len(scope.get("root_path", "")) :] or "/"
        if CONTROL_PATHS.match(path):
            response = await self._control(request, path)
        else:
            response = await envd.handle(self.gateway, request, path)
        await response(scope, receive, send)

    async def _control(self, request: Request, path: str) -> Response:
        try:
            return await self._dispatch(request, path)
        except SandcellError as exc:
            return errors.rest_error(exc)

    async def _dispatch(self, request: Request, path: str) -> Response:
        for method, pattern, fn in self.routes:
            if request.method == method and (match := pattern.match(path)):
                params = {k: v for k, v in match.groupdict().items() if v}
                return await fn(request, **params)
        raise SandcellError(ErrorCode.NOT_FOUND, f"{request.method} {path} is not served")


def mount(app: Starlette) -> None:
    """Serves the façade under /e2b of `app`, the router's own app (`app.state.router`)."""
    facade = E2bFacade(Gateway(app.state.router))
    app.router.routes.append(Mount(PREFIX, app=facade))
