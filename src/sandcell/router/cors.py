"""Cross-origin access for browser clients (`[server] cors_origins`), such as E2B's JS SDK
run in a page: the listed origins may send the headers of sandcell's API and of the E2B
façade. Preflights are answered here, before the door: they carry no key and take no slot.
"""

from __future__ import annotations

from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp

METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
REQUEST_HEADERS = (
    # sandcell's own API
    "Authorization",
    "Content-Type",
    # E2B's control API, envd and its Connect protocol
    "X-API-KEY",
    "X-Access-Token",
    "E2b-Sandbox-Id",
    "E2b-Sandbox-Port",
    "Connect-Protocol-Version",
    "Connect-Timeout-Ms",
    "Connect-Accept-Encoding",
    "Connect-Content-Encoding",
    "Keepalive-Ping-Interval",
)
EXPOSED_HEADERS = ("X-Next-Token", "Retry-After", "X-Request-Id")
PREFLIGHT_MAX_AGE_S = 600


def cross_origin(app: ASGIApp, origins: tuple[str, ...]) -> ASGIApp:
    """`app` answering CORS for `origins` (none: `app` as it is, same-origin only)."""
    if not origins:
        return app
    return CORSMiddleware(
        app,
        allow_origins=origins,
        allow_methods=METHODS,
        allow_headers=REQUEST_HEADERS,
        expose_headers=EXPOSED_HEADERS,
        max_age=PREFLIGHT_MAX_AGE_S,
    )
