"""The in-sandbox API ("envd") of E2B: who may call it, and which handler serves each path.

Every call names its sandbox (`E2b-Sandbox-Id`) and proves it may use it with the sandbox's
`X-Access-Token`, minted at create and stored hashed (see `tokens`). The handlers then reach
the daemon only through the router's signing proxy (`Gateway.daemon`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from sandcell.compat.e2b import errors, files, interpreter
from sandcell.compat.e2b.bodies import json_object
from sandcell.compat.e2b.envd import connect, filesystem, process, watch
from sandcell.compat.e2b.gateway import Gateway
from sandcell.errors import ErrorCode, SandcellError
from sandcell.http.bodies import read_body
from sandcell.router.core import GONE
from sandcell.store import SandboxRecord

MAX_MESSAGE_BODY = 8 * 1_048_576
UNARY: dict[str, Callable[..., Awaitable[dict[str, Any]]]] = {
    **{f"/process.Process/{name}": fn for name, fn in process.UNARY.items()},
    **{f"/filesystem.Filesystem/{name}": fn for name, fn in filesystem.UNARY.items()},
    **{f"/filesystem.Filesystem/{name}": fn for name, fn in watch.UNARY.items()},
}
STREAMS = {
    **{f"/process.Process/{name}": fn for name, fn in process.STREAMS.items()},
    **{f"/filesystem.Filesystem/{name}": fn for name, fn in watch.STREAMS.items()},
}


async def authorised(gateway: Gateway, request: Request) -> SandboxRecord:
    """The running sandbox the call names, once its token is checked. The token is checked
    first, so only its holder learns that a sandbox has gone (E2B's "was not found", which
    the SDK turns into `SandboxNotRunningException` and `is_running() == False`)."""
    sandbox_id = request.headers.get("e2b-sandbox-id", "")
    # The code interpreter's context calls carry only the traffic token; sandcell hands out
    # the same secret as both (see control.py).
    token = request.headers.get("x-access-token") or request.headers.get(
        "e2b-traffic-access-token", ""
    )
    if not sandbox_id or not await gateway.tokens.check(sandbox_id, token):
        raise SandcellError(ErrorCode.UNAUTHENTICATED, "missing or wrong X-Access-Token")
    record = await gateway.router.store.get_sandbox(sandbox_id)
    if record is None or record.state in GONE:
        raise SandcellError(
            ErrorCode.SANDBOX_UNREACHABLE, f"The sandbox {sandbox_id} was not found"
        )
    # The sandbox's owner pays for the call, as for its own proxied requests; a paused
    # sandbox wakes on the call (or answers 409) as on /v1.
    gateway.router.door.admit(request.scope, record.owner)
    return record


async def _rpc(gateway: Gateway, record: SandboxRecord, request: Request, path: str) -> Response:
    body = await read_body(request, MAX_MESSAGE_BODY)
    if path in STREAMS:
        events = _stream_events(STREAMS[path], gateway, record, body)
        return StreamingResponse(connect.stream(events), media_type=connect.STREAM_MEDIA)
    if path in UNARY:
        return JSONResponse(await UNARY[path](gateway, record, json_object(body)))
    raise SandcellError(ErrorCode.NOT_IMPLEMENTED, f"{path} is not served by sandcell")


async def _stream_events(
    handler: Callable[..., AsyncIterator[dict[str, Any]]],
    gateway: Gateway,
    record: SandboxRecord,
    body: bytes,
) -> AsyncIterator[dict[str, Any]]:
    """A stream's events; a bad request message, too, ends the stream with its error."""
    async for event in handler(gateway, record, connect.first_message(body)):
        yield event


async def _serve(gateway: Gateway, request: Request, path: str) -> Response:
    record = await authorised(gateway, request)
    if path == "/health":
        if record.state != "running":  # E2B's `is_running()`: a paused sandbox is not
            raise SandcellError(ErrorCode.SANDBOX_UNREACHABLE, f"sandbox {record.id} is paused")
        return Response(status_code=204)
    if request.headers.get("e2b-sandbox-port") == interpreter.PORT and not path.startswith(
        ("/process.", "/filesystem.", "/files")
    ):
        return await interpreter.serve(gateway, record, request, path)
    if path == "/files":
        if request.method == "GET":
            return await files.download(gateway, record, request)
        if request.method in ("POST", "PUT"):
            return await files.upload(gateway, record, request)
        raise SandcellError(ErrorCode.METHOD_NOT_ALLOWED, f"{request.method} /files is not served")
    return await _rpc(gateway, record, request, path)


async def handle(gateway: Gateway, request: Request, path: str) -> Response:
    rpc = path.startswith(("/process.", "/filesystem."))
    try:
        return await _serve(gateway, request, path)
    except SandcellError as exc:
        return errors.connect_unary_error(exc) if rpc else errors.rest_error(exc)
