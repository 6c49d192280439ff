"""The `X-API-KEY` of E2B's control API: the sandcell key in it (as given, which covers the
native `e2b_<hex>` keys of `sandcell keys create --e2b`, or an `sc_` key hex-encoded behind
`e2b_`), checked before any handler runs, and every error in E2B's REST shape.
"""

from __future__ import annotations

import contextlib
import re

from starlette.requests import Request
from starlette.responses import Response

from sandcell.compat.e2b import errors
from sandcell.compat.e2b.control.common import Handler
from sandcell.compat.e2b.gateway import Gateway
from sandcell.errors import ServiceError
from sandcell.http.openapi import Endpoint
from sandcell.store.crypto import E2B_KEY_PREFIX, SANDCELL_KEY_PREFIX

# `e2b_` and an `sc_` key in hex: the form that passes older SDKs' `e2b_<hex>` check.
HEX_ENCODED_KEY = re.compile(r"\Ae2b_" + SANDCELL_KEY_PREFIX.encode().hex() + r"(?:[0-9a-f]{2})+\Z")

SECURITY = ("e2bApiKey",)

SCHEME = {
    "type": "apiKey",
    "in": "header",
    "name": "X-API-KEY",
    "description": "a sandcell API key: as given (`sc_…`, or `e2b_…` from `keys create --e2b`), "
    "or an `sc_` key hex-encoded behind `e2b_`",
}


def sandcell_key(api_key: str) -> str:
    """The sandcell key in an `X-API-KEY`: as given, or the `sc_` key hex-encoded behind
    `e2b_`. Native `e2b_` keys never start with the hex of `sc_` (see `new_api_key`)."""
    if HEX_ENCODED_KEY.match(api_key):
        with contextlib.suppress(ValueError):
            return bytes.fromhex(api_key[len(E2B_KEY_PREFIX) :]).decode("ascii")
    return api_key


def _secured(name: str, handler: Handler) -> Endpoint:
    """`handler` for the principal of the call's `X-API-KEY`, checked before it runs (so no
    control operation can forget it), its errors in E2B's REST shape."""

    async def endpoint(request: Request) -> Response:
        try:
            gateway = Gateway.of(request)
            key = sandcell_key(request.headers.get("x-api-key", ""))
            principal = await gateway.router.principal(request, key)
            return await handler(gateway, principal, request)
        except ServiceError as exc:
            return errors.rest_error(exc)

    endpoint.__name__ = endpoint.__qualname__ = f"e2b_{name}"
    return endpoint
