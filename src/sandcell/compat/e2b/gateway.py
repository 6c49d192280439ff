"""The façade's way into sandcell: the router core, the one way it reaches a sandbox.

Control calls are the router's own operations for the principal of the caller's key
(see control/). In-sandbox calls are `Call`s sent through `Router.send`, so the daemon
receives a fresh, signed, single-use request token as for any other call, and a paused
sandbox wakes (or answers 409) exactly as on `/v1`. Nothing here talks to a daemon directly.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any
from urllib.parse import quote, urlencode

from starlette.requests import Request

from sandcell.compat.e2b.tokens import AccessTokens
from sandcell.errors import ErrorCode, ServiceError
from sandcell.http.bodies import declared_length
from sandcell.router.core import Answer, Call, Router
from sandcell.store import SandboxRecord


def _line(data: bytes) -> dict[str, Any]:
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:  # a stream cut mid-line (a truncated relay)
        raise ServiceError(ErrorCode.SANDBOX_UNREACHABLE, "the sandbox's stream was cut") from exc


async def ndjson(answer: Answer) -> AsyncIterator[dict[str, Any]]:
    buffer = b""
    async for chunk in answer.chunks():
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if line.strip():
                yield _line(line)
    if buffer.strip():
        yield _line(buffer)


class Gateway:
    """The router core of one sandcell app (its `state.router`), and the domain its sandboxes'
    hosts are under (`server.preview_domain`; "" when unset)."""

    def __init__(self, router: Router, domain: str = "") -> None:
        self.router = router
        self.domain = domain
        self.tokens = AccessTokens(router.store)

    @classmethod
    def of(cls, request: Request) -> Gateway:
        """The gateway of the app serving `request` (its `state.router`), made once per app."""
        state = request.app.state
        gateway = getattr(state, "e2b_gateway", None)
        if gateway is None or gateway.router is not state.router:
            gateway = cls(state.router, getattr(state, "preview_domain", ""))
            state.e2b_gateway = gateway
        return gateway

    async def daemon(
        self,
        record: SandboxRecord,
        method: str,
        rest: str,
        *,
        body: bytes | Request = b"",
        query: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Answer:
        """`method /v1/<rest>` on the sandbox's daemon; `body` may be the caller's request,
        whose body then streams through unbuffered. A daemon's error is raised as the same
        `ServiceError`."""
        target = "/v1/" + quote(rest, safe="/") + (f"?{urlencode(query)}" if query else "")
        fields = [
            (k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()
        ]
        if isinstance(body, Request):
            call = Call(method, target, fields, None, body.stream(), declared_length(body))
        else:
            call = Call(method, target, fields, body)
        return await (await self.router.send(record, call)).raise_for_error()

    async def json(self, record: SandboxRecord, method: str, rest: str, **kwargs: Any) -> Any:
        """`daemon`'s JSON answer."""
        return await (await self.daemon(record, method, rest, **kwargs)).json()
