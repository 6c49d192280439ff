"""The console's own routes at `/ui/` (SPEC §19): its page and assets, and the session
(sign in, who am I, sign out). Everything else the page does, it does through the /v1 API,
authenticated by the session cookie in `Router.authenticate`: the console has no side door.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import parse_qs

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sandcell.console import session, vendor
from sandcell.errors import ErrorCode, ServiceError
from sandcell.http.bodies import read_body
from sandcell.http.errors import EXCEPTION_HANDLERS
from sandcell.store import hash_api_key

if TYPE_CHECKING:
    from sandcell.router.core import Router

log = logging.getLogger("sandcell.console")
STATIC = Path(__file__).parent / "static"
MAX_SIGN_IN_BODY = 4096
# No inline script or style, nothing from elsewhere, never framed.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
]


def _router(request: Request) -> Router:
    return request.app.state.router


async def index(request: Request) -> Response:
    return FileResponse(STATIC / "index.html", media_type="text/html; charset=utf-8")


def _view(principal_name: str, admin: bool, csrf: str) -> dict[str, object]:
    return {"principal": principal_name, "admin": admin, "csrf_token": csrf}


async def sign_in(request: Request) -> Response:
    """`api_key=...` (form-encoded): sets the session cookie; 401 for a key that is not."""
    session.check_origin(request)  # a forged sign-in would plant the forger's session
    form = parse_qs((await read_body(request, MAX_SIGN_IN_BODY)).decode("utf-8", "replace"))
    key = (form.get("api_key") or [""])[0].strip()
    if not key:
        raise ServiceError(ErrorCode.BAD_REQUEST, "api_key is required")
    r = _router(request)
    client = request.client.host if request.client else "unknown"
    principal = await r.auth.authenticate(f"Bearer {key}", client)
    value, sess = await session.issue(r.store, hash_api_key(key))
    response = JSONResponse(_view(principal.name, principal.admin, sess.csrf))
    response.set_cookie(
        session.COOKIE,
        value,
        max_age=session.SESSION_TTL_S,
        path="/",
        secure=request.url.scheme == "https",
        httponly=True,
        samesite="strict",
    )
    return response


async def whoami(request: Request) -> Response:
    """The signed-in principal and the session's CSRF token (for the page's script)."""
    if session.COOKIE not in request.cookies:
        raise ServiceError(ErrorCode.UNAUTHENTICATED, "not signed in")
    principal, sess = await session.principal(request, _router(request).store)
    return JSONResponse(_view(principal.name, principal.admin, sess.csrf))


async def sign_out(request: Request) -> Response:
    """Clears the cookie; asked with the session's CSRF token from the page's own origin."""
    session.check_origin(request)
    sess = await session.read(_router(request).store, request.cookies.get(session.COOKIE, ""))
    if sess is not None:  # one that no longer opens is cleared without asking
        session.check_token(request.headers.get(session.CSRF_HEADER), sess, "X-CSRF-Token")
    response = Response(status_code=204)
    response.delete_cookie(session.COOKIE, path="/", httponly=True, samesite="strict")
    return response


class SecurityHeaders:
    """The console's headers on every response under /ui, its errors included."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, with_headers)


def create_console(router: Router) -> ASGIApp:
    """The app mounted at /ui."""
    if missing := [name for name in vendor.FILES if not (vendor.VENDOR / name).is_file()]:
        log.warning(
            "the console's assets are missing (%s): run scripts/setup.sh, or `npm ci --prefix "
            "%s` and `python -m sandcell.console.vendor`",
            ", ".join(missing),
            vendor.HERE / "web",
        )
    app = Starlette(
        routes=[
            Route("/", index, methods=["GET"]),
            Route("/session", sign_in, methods=["POST"]),
            Route("/session", whoami, methods=["GET"]),
            Route("/session", sign_out, methods=["DELETE"]),
            Mount("/static", StaticFiles(directory=STATIC, check_dir=False), name="static"),
        ],
        exception_handlers=EXCEPTION_HANDLERS,
    )
    app.state.router = router
    return SecurityHeaders(app)
