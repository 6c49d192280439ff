"""Calls to a sandbox's daemon on behalf of a façade request: built as an in-process request
and sent through the router's `DaemonProxy`, so it is signed (a single-use token bound to the
method, path and body) and counted as activity exactly like a call to `/v1/sandboxes/...`."""

from __future__ import annotations

import json
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from sandcell.compat import inprocess
from sandcell.compat.inprocess import read_all
from sandcell.errors import ErrorCode, SandcellError
from sandcell.store import SandboxRecord


async def send(
    request: Request,
    record: SandboxRecord,
    method: str,
    target: str,
    body: bytes = b"",
    content_type: str | None = None,
) -> Response:
    """The daemon's streamed answer to `method target` (`target` is its /v1/... path)."""
    router = request.app.state.router
    path, _, query = target.partition("?")
    headers = {} if content_type is None else {"content-type": content_type}
    inner = inprocess.request(request.app, method, path, body=body, query=query, headers=headers)
    await router.store.touch(record.id, time.time())
    return await router.proxy.forward(inner, record, path.removeprefix("/v1/"), target=target)


async def json_of(response: Response) -> Any:
    """The daemon's JSON answer; its error (SPEC §1 shape) is raised as the same error."""
    data = await read_all(response)
    if response.status_code >= 400:
        raise inprocess.daemon_error(response.status_code, data)
    try:
        return json.loads(data) if data else None
    except ValueError as exc:
        raise SandcellError(ErrorCode.SANDBOX_UNREACHABLE, "the sandbox answered oddly") from exc
