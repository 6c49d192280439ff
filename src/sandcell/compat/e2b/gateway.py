"""sandcell's own router, called in-process: the one way the façade reaches a sandbox.

Control calls run the router's handlers with the caller's API key, so authentication, the
per-key limits and ownership are the router's own. In-sandbox calls go through the router's
`DaemonProxy.forward`, so the daemon receives a fresh, signed, single-use request token as for
any other proxied request. Nothing here talks to a daemon directly.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp

from sandcell.compat.inprocess import body_chunks, daemon_error, read_all, request
from sandcell.errors import ErrorCode, SandcellError
from sandcell.store import SandboxRecord

Handler = Callable[[Request], Awaitable[Response]]


def _line(data: bytes) -> dict[str, Any]:
    try:
        return json.loads(data)
    except ValueError as exc:  # a stream cut mid-line (the relay truncates on upstream errors)
        raise SandcellError(ErrorCode.SANDBOX_UNREACHABLE, "the sandbox's stream was cut") from exc


async def ndjson(response: Response) -> AsyncIterator[dict[str, Any]]:
    buffer = b""
    async for chunk in body_chunks(response):
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if line.strip():
                yield _line(line)
    if buffer.strip():
        yield _line(buffer)


class Gateway:
    """Calls into one sandcell router app (its `state.router` is the `Router`)."""

    def __init__(self, app: ASGIApp, router: Any) -> None:
        self.app = app
        self.router = router

    async def control(
        self,
        handler: Handler,
        api_key: str,
        client: str,
        method: str,
        path: str,
        *,
        body: bytes = b"",
        path_params: dict[str, str] | None = None,
    ) -> Response:
        """Runs a router handler as the holder of `api_key` would call it over HTTP."""
        req = request(
            self.app,
            method,
            path,
            body=body,
            path_params=path_params,
            headers={"authorization": f"Bearer {api_key}", "content-type": "application/json"},
            client=client,
        )
        try:
            return await handler(req)
        finally:
            self.router.release(req.scope)

    async def daemon(
        self,
        record: SandboxRecord,
        method: str,
        rest: str,
        *,
        body: bytes | Request = b"",
        query: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> Response:
        """`method /v1/<rest>` on the sandbox's daemon, signed by the router's proxy; `body`
        may be the caller's request, whose body then streams through (see `request`)."""
        if record.state != "running":
            raise SandcellError(ErrorCode.CONFLICT, f"sandbox {record.id} is {record.state}")
        await self.router.store.touch(record.id, time.time())
        path = f"/v1/sandboxes/{record.id}/{rest}"
        req = request(
            self.app,
            method,
            path,
            body=body,
            query=query,
            headers=headers,
            path_params={"sandbox_id": record.id, "rest": rest},
        )
        response = await self.router.proxy.forward(req, record, rest)
        if response.status_code >= 400:
            raise daemon_error(response.status_code, await read_all(response))
        return response
