"""Calls to a sandbox's daemon on behalf of a PicoD request: `Call`s through the router core,
so each is signed (a single-use token bound to the method, path and body), counted as
activity and wakes a paused sandbox exactly like a call to `/v1/sandboxes/...`."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from sandcell.router.core import Answer, Call
from sandcell.router.proxy import respond
from sandcell.store import SandboxRecord


async def call(
    request: Request,
    record: SandboxRecord,
    method: str,
    target: str,
    body: bytes = b"",
    content_type: str | None = None,
) -> Answer:
    """The daemon's answer to `method target` (`target` is its /v1/... path)."""
    headers = () if content_type is None else ((b"content-type", content_type.encode()),)
    return await request.app.state.router.send(record, Call(method, target, headers, body))


async def json_of(
    request: Request,
    record: SandboxRecord,
    method: str,
    target: str,
    body: bytes = b"",
    content_type: str | None = None,
) -> Any:
    """The daemon's JSON answer; its error (SPEC §1 shape) is raised as the same error."""
    return await (await call(request, record, method, target, body, content_type)).json()


async def relayed(request: Request, record: SandboxRecord, method: str, target: str) -> Response:
    """The daemon's answer relayed as it comes (a download)."""
    return respond(await call(request, record, method, target))
