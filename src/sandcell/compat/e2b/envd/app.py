"""The in-sandbox API ("envd") of E2B as a route table: who may call it, and what serves each
operation.

Every call names its sandbox (`E2b-Sandbox-Id`; without it, the access token, which names its
sandbox under its MAC) and proves it may use it with the sandbox's `X-Access-Token`, minted at
create (see `tokens`). Each operation's handler is wrapped once, where the table is built
(`_secured`): the token is checked and the record found before the handler runs, and its
errors leave in the shape of its kind (Connect's unary error, or E2B's REST error; a stream
ends with its error in the stream). The handlers reach the daemon only
through the router core (`Gateway.daemon`).

The code interpreter E2B serves on port 49999 (`/execute`, `/contexts`) shares this table:
its paths are its own, so the `E2b-Sandbox-Port` header the SDK sends tells nothing apart.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from pydantic import BaseModel, ConfigDict
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from sandcell.compat.e2b import errors, files, interpreter, signed
from sandcell.compat.e2b.bodies import json_object
from sandcell.compat.e2b.envd import connect, filesystem, process, watch
from sandcell.compat.e2b.gateway import Gateway
from sandcell.errors import ErrorCode, ServiceError
from sandcell.http.bodies import read_body
from sandcell.http.onewrite import ABORT
from sandcell.http.openapi import Endpoint, Operation, Query
from sandcell.http.streamed import Streamed
from sandcell.router.core import GONE
from sandcell.store import SandboxRecord

MAX_MESSAGE_BODY = 8 * 1_048_576
Message = dict[str, Any]
Unary = Callable[[Gateway, SandboxRecord, Message], Awaitable[Message]]
Stream = Callable[[Gateway, SandboxRecord, connect.StreamRequest], AsyncIterator[Message]]
Handler = Callable[[Gateway, SandboxRecord, Request], Awaitable[Response]]
Authorise = Callable[[Gateway, Request], Awaitable[SandboxRecord]]
UNARY: dict[str, Unary] = {
    **{f"/process.Process/{name}": fn for name, fn in process.UNARY.items()},
    **{f"/filesystem.Filesystem/{name}": fn for name, fn in filesystem.UNARY.items()},
    **{f"/filesystem.Filesystem/{name}": fn for name, fn in watch.UNARY.items()},
}
STREAMS: dict[str, Stream] = {
    **{f"/process.Process/{name}": fn for name, fn in process.STREAMS.items()},
    **{f"/filesystem.Filesystem/{name}": fn for name, fn in watch.STREAMS.items()},
}
SECURITY = ("e2bSandboxId", "e2bAccessToken")
SCHEMES = {
    "e2bSandboxId": {
        "type": "apiKey",
        "in": "header",
        "name": "E2b-Sandbox-Id",
        "description": "the sandbox the call is for (with its X-Access-Token)",
    },
    "e2bAccessToken": {
        "type": "apiKey",
        "in": "header",
        "name": "X-Access-Token",
        "description": "the sandbox's envdAccessToken (E2b-Traffic-Access-Token, the same "
        "secret, is accepted instead)",
    },
}


async def authorised(gateway: Gateway, request: Request) -> SandboxRecord:
    """The running sandbox the call names, once its token is checked. The token is checked
    first, so only its holder learns that a sandbox has gone (E2B's "was not found", which
    the SDK turns into `SandboxNotRunningException` and `is_running() == False`)."""
    # The code interpreter's context calls carry only the traffic token; sandcell hands out
    # the same secret as both (see control.py).
    token = request.headers.get("x-access-token") or request.headers.get(
        "e2b-traffic-access-token", ""
    )
    # Older SDKs (2.20 after `Sandbox.connect()`) send no E2b-Sandbox-Id: the token names
    # its sandbox, under its MAC, so the call is routed by it (tokens.py).
    sandbox_id = request.headers.get("e2b-sandbox-id") or gateway.tokens.names(token)
    if not sandbox_id:
        raise ServiceError(
            ErrorCode.BAD_REQUEST,
            "missing sandbox id: the call has no E2b-Sandbox-Id header and no "
            "X-Access-Token that names a sandbox",
        )
    if not await gateway.tokens.check(sandbox_id, token):
        raise ServiceError(ErrorCode.UNAUTHENTICATED, "missing or wrong X-Access-Token")
    record = await gateway.router.store.get_sandbox(sandbox_id)
    if record is None or record.state in GONE:
        raise ServiceError(ErrorCode.SANDBOX_UNREACHABLE, f"The sandbox {sandbox_id} was not found")
    # The sandbox's owner pays for the call, as for its own proxied requests; a paused
    # sandbox wakes on the call (or answers 409) as on /v1.
    gateway.router.door.admit(request.scope, record.owner)
    return record


async def authorised_file(gateway: Gateway, request: Request) -> SandboxRecord:
    """envd's GET and POST /files: the access token, or (without one, as envd) a signed
    URL's signature in the query, for the sandbox the call names (`signed`)."""
    tokenless = not request.headers.get("x-access-token")
    if tokenless and "signature" in request.query_params:
        named = request.headers.get("e2b-sandbox-id")
        if not named:
            raise ServiceError(ErrorCode.BAD_REQUEST, "missing sandbox id: no E2b-Sandbox-Id")
        return await signed.signed_record(gateway, request, named)
    return await authorised(gateway, request)


def _secured(
    name: str,
    handler: Handler,
    shape: Callable[[ServiceError], Response],
    authorise: Authorise = authorised,
) -> Endpoint:
    """`handler` for the sandbox the call's credential opens (`authorise`), checked before it
    runs (so no envd operation can forget it), its errors in `shape`."""

    async def endpoint(request: Request) -> Response:
        try:
            gateway = Gateway.of(request)
            return await handler(gateway, await authorise(gateway, request), request)
        except ServiceError as exc:
            return shape(exc)

    endpoint.__name__ = endpoint.__qualname__ = f"e2b_envd_{name}"
    return endpoint


# -- handlers by kind ------------------------------------------------------------------------


def _unary(fn: Unary) -> Handler:
    async def handler(gateway: Gateway, record: SandboxRecord, request: Request) -> Response:
        message = json_object(await read_body(request, MAX_MESSAGE_BODY))
        return JSONResponse(await fn(gateway, record, message))

    return handler


def _stream(fn: Stream) -> Handler:
    async def handler(gateway: Gateway, record: SandboxRecord, request: Request) -> Response:
        body = await read_body(request, MAX_MESSAGE_BODY)
        timeout = connect.timeout_s(request.headers)
        events = _stream_events(fn, gateway, record, body, timeout)
        relay = connect.stream(events, timeout, request.scope.get(ABORT))
        return Streamed(relay, media_type=connect.STREAM_MEDIA)

    return handler


async def _stream_events(
    fn: Stream, gateway: Gateway, record: SandboxRecord, body: bytes, timeout: float | None
) -> AsyncIterator[Message]:
    """A stream's events; a bad request message, too, ends the stream with its error."""
    async for event in fn(gateway, record, connect.first_message(body, timeout)):
        yield event


async def health(gateway: Gateway, record: SandboxRecord, request: Request) -> Response:
    if record.state != "running":  # E2B's `is_running()`: a paused sandbox is not
        raise ServiceError(ErrorCode.SANDBOX_UNREACHABLE, f"sandbox {record.id} is paused")
    return Response(status_code=204)


# -- request messages, as far as the handlers read them (for the document and the fuzzer) ---


class _Message(BaseModel):
    model_config = ConfigDict(extra="allow")


class ProcessSelector(_Message):
    pid: int | None = None
    tag: str | None = None


class ProcessInput(_Message):
    stdin: str | None = None  # base64
    pty: str | None = None


class PtySize(_Message):
    cols: int | None = None
    rows: int | None = None


class Pty(_Message):
    size: PtySize | None = None


class ListRequest(_Message):
    pass


class SendInputRequest(_Message):
    process: ProcessSelector
    input: ProcessInput | None = None


class SendSignalRequest(_Message):
    process: ProcessSelector
    signal: str | None = None


class CloseStdinRequest(_Message):
    process: ProcessSelector


class UpdateRequest(_Message):
    process: ProcessSelector
    pty: Pty | None = None


class PathRequest(_Message):
    path: str


class ListDirRequest(_Message):
    path: str
    depth: int | None = None


class MoveRequest(_Message):
    source: str
    destination: str


class CreateWatcherRequest(_Message):
    path: str
    recursive: bool | None = None
    includeEntry: bool | None = None
    allowNetworkMounts: bool | None = None  # envd 0.6.4: the same polled watch (watch.py)


class WatcherRequest(_Message):
    watcherId: str


MESSAGES: dict[str, type[BaseModel]] = {
    "/process.Process/List": ListRequest,
    "/process.Process/SendInput": SendInputRequest,
    "/process.Process/SendSignal": SendSignalRequest,
    "/process.Process/CloseStdin": CloseStdinRequest,
    "/process.Process/Update": UpdateRequest,
    "/filesystem.Filesystem/Stat": PathRequest,
    "/filesystem.Filesystem/MakeDir": PathRequest,
    "/filesystem.Filesystem/Remove": PathRequest,
    "/filesystem.Filesystem/ListDir": ListDirRequest,
    "/filesystem.Filesystem/Move": MoveRequest,
    "/filesystem.Filesystem/CreateWatcher": CreateWatcherRequest,
    "/filesystem.Filesystem/GetWatcherEvents": WatcherRequest,
    "/filesystem.Filesystem/RemoveWatcher": WatcherRequest,
}

# -- the table -------------------------------------------------------------------------------

_ERRORS = (400, 401, 403, 404, 409, 413, 429, 502, 503, 504)


def _op(
    method: str,
    path: str,
    name: str,
    handler: Handler,
    summary: str,
    *,
    connect_rpc: bool = False,
    authorise: Authorise = authorised,
    **kw: Any,
) -> Operation:
    shape = errors.connect_unary_error if connect_rpc else errors.rest_error
    return Operation(
        method,
        path,
        _secured(name, handler, shape, authorise),
        summary,
        errors=_ERRORS,
        security=SECURITY,
        error_body=errors.ConnectError if connect_rpc else errors.RestError,
        **kw,
    )


def _rpc_name(path: str) -> str:
    service, method = path.strip("/").split("/")
    return f"{service.split('.')[0]}_{method}"


_PATH_QUERY = (
    Query("path", {"type": "string"}, description="in the sandbox (/home/user is the workspace)"),
    Query("username", {"type": "string"}),
)
_CONTEXT = "/contexts/{context_id}"

OPERATIONS = (
    *(
        _op(
            "POST",
            path,
            _rpc_name(path),
            _unary(fn),
            f"E2B envd: Connect RPC {path.strip('/')} (unary, JSON)",
            connect_rpc=True,
            body=MESSAGES[path],
        )
        for path, fn in UNARY.items()
    ),
    *(
        _op(
            "POST",
            path,
            _rpc_name(path),
            _stream(fn),
            f"E2B envd: Connect RPC {path.strip('/')} (server stream; errors end the stream)",
            connect_rpc=True,
            body=connect.STREAM_MEDIA,
            response=connect.STREAM_MEDIA,
        )
        for path, fn in STREAMS.items()
    ),
    _op(
        "GET",
        "/files",
        "download",
        files.download,
        "E2B envd: download a file (the access token, or a signed URL's signature)",
        query=_PATH_QUERY,
        authorise=authorised_file,
        response="application/octet-stream",
    ),
    *(
        _op(
            method,
            "/files",
            f"upload_{method.lower()}",
            files.upload,
            "E2B envd: upload files (octet-stream, gzip or a multipart form)",
            query=_PATH_QUERY,
            authorise=authorised_file if method == "POST" else authorised,
            body="application/octet-stream",
        )
        for method in ("POST", "PUT")
    ),
    _op("GET", "/health", "health", health, "E2B envd: the sandbox runs", status=204),
    _op(
        "POST",
        "/execute",
        "execute",
        interpreter.execute,
        "E2B code interpreter: run code (NDJSON lines)",
        body=interpreter.ExecuteRequest,
        response="application/x-ndjson",
    ),
    _op(
        "POST",
        "/contexts",
        "create_context",
        interpreter.create_context,
        "E2B code interpreter: create a context",
        body=interpreter.CreateContext,
    ),
    _op(
        "GET",
        "/contexts",
        "list_contexts",
        interpreter.list_contexts,
        "E2B code interpreter: list the contexts",
    ),
    _op(
        "DELETE",
        _CONTEXT,
        "remove_context",
        interpreter.remove_context,
        "E2B code interpreter: remove a context",
        status=204,
    ),
    _op(
        "POST",
        f"{_CONTEXT}/restart",
        "restart_context",
        interpreter.restart_context,
        "E2B code interpreter: restart a context",
        status=204,
    ),
)
