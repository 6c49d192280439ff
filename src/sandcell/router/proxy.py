"""Forwarding a user's request to a sandbox's daemon, signed with a fresh request JWT.

Small bodies are buffered and bound to the token (`bsh`); file uploads stream through
untouched in both directions, so a large file is never held whole in memory. A daemon's
answer that has arrived whole by the time its head is read (most are) goes back to the user
as one buffered response; others are relayed as they come.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from sandcell import tokens
from sandcell.cellapi.client import dialer
from sandcell.errors import ErrorCode, SandcellError
from sandcell.http.bodies import declared_length, read_body
from sandcell.http.upstream import (
    Connection,
    Dial,
    Headers,
    Pool,
    UpstreamError,
    UpstreamTimeout,
    request_head,
)
from sandcell.store import SandboxRecord, Store

BUFFER_LIMIT = 8 * 1_048_576  # the daemon's own JSON limit
STREAM_UPLOADS_FROM = 1_048_576
# A daemon's answer of at most this length, whole within the grace, goes back as one
# buffered response (a slower one, e.g. from a user's server behind a port, is relayed).
BUFFER_ANSWERS_UP_TO = 256 * 1024
BUFFER_GRACE_S = 0.25
CONNECT_TIMEOUT_S = 2.0
DEFAULT_READ_TIMEOUT_S = 120.0
EXEC_TIMEOUT_MARGIN_S = 30.0
MAX_EXEC_TIMEOUT_S = 86_400.0
# The router's own server sets these on every response: not copied from the daemon's.
SERVER_HEADERS = {b"date", b"server"}
HOP_BY_HOP = {
    b"connection",
    b"keep-alive",
    b"proxy-authenticate",
    b"proxy-authorization",
    b"te",
    b"trailers",
    b"transfer-encoding",
    b"upgrade",
    b"expect",  # the router answers a client's 100-continue itself
    b"host",
    b"authorization",
    b"content-length",
}
# What of the daemon's answer is not relayed (a streamed answer keeps its length).
NOT_RELAYED = (HOP_BY_HOP - {b"content-length"}) | SERVER_HEADERS


class _Lru(OrderedDict[str, Any]):
    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity

    def get_fresh(self, key: str) -> Any:
        if key in self:
            self.move_to_end(key)
            return self[key]
        return None

    def put(self, key: str, value: Any) -> Any:
        """Stores `value`; returns the evicted value, if any."""
        self[key] = value
        if len(self) > self.capacity:
            return self.popitem(last=False)[1]
        return None


# A daemon endpoint to how to connect to it and the Host its requests name.
DialerFactory = Callable[[dict[str, Any]], tuple[Dial, bytes]]


class DaemonProxy:
    """`dialer_for` maps a daemon endpoint to a way of connecting to it; tests pass one that
    reaches a daemon app served in-process."""

    def __init__(
        self,
        store: Store,
        key_cache_size: int = 4096,
        max_pools: int = 1024,
        dialer_for: DialerFactory = dialer,
    ) -> None:
        self.store = store
        self._dialer_for = dialer_for
        self._keys = _Lru(key_cache_size)
        self._pools = _Lru(max_pools)

    async def close(self) -> None:
        for pool, _ in self._pools.values():
            pool.close()
        self._pools.clear()

    def forget(self, record: SandboxRecord) -> None:
        """Drops what is cached for a deleted sandbox: its key and its connections."""
        self._keys.pop(record.id, None)
        entry = self._pools.pop(_ident(record.endpoint), None)
        if entry is not None:
            entry[0].close()

    async def _session_key(self, sandbox_id: str) -> tokens.PrivateKey:
        key = self._keys.get_fresh(sandbox_id)
        if key is None:
            pem = await self.store.get_session_key(sandbox_id)
            if pem is None:
                raise SandcellError(ErrorCode.SANDBOX_NOT_FOUND, f"sandbox {sandbox_id} not found")
            key = tokens.load_private_key(pem)
            self._keys.put(sandbox_id, key)
        return key

    async def signing_key(self, sandbox_id: str) -> tokens.PrivateKey:
        """The sandbox's session key, for requests signed outside `forward` (WebSockets)."""
        return await self._session_key(sandbox_id)

    def _pool(self, endpoint: dict[str, Any]) -> tuple[Pool, bytes]:
        ident = _ident(endpoint)
        entry = self._pools.get_fresh(ident)
        if entry is None:
            dial, host = self._dialer_for(endpoint)
            entry = (Pool(dial), host)
            if (evicted := self._pools.put(ident, entry)) is not None:
                evicted[0].close()
        return entry

    async def forward(
        self, request: Request, record: SandboxRecord, rest: str, target: str | None = None
    ) -> Response:
        """`target` is the daemon's path when the request's own path is not a sandbox path
        (a preview URL); by default it is derived from the request."""
        key = await self._session_key(record.id)
        target = target or _daemon_target(request, rest)
        body, stream = await _body(request, rest)
        token = tokens.mint_request_token(key, record.id, request.method, target, body)
        pool, host = self._pool(record.endpoint)
        head = _head(request, target, host, token, body)
        timeout = _read_timeout(rest, body)
        with _mapped_errors(record.id):
            conn = await pool.acquire(CONNECT_TIMEOUT_S)
            try:
                if stream is None:
                    conn.send(head + (body or b""))
                else:
                    chunked = declared_length(request) is None
                    await conn.send_stream(head, stream, chunked, timeout)
                await conn.response_head(timeout)
                await conn.whole_if_within(BUFFER_ANSWERS_UP_TO, BUFFER_GRACE_S)
            except BaseException:
                conn.close()
                raise
        return _answer(pool, conn, timeout)


def _ident(endpoint: dict[str, Any]) -> str:
    return json.dumps(endpoint, sort_keys=True)


@contextlib.contextmanager
def _mapped_errors(sandbox_id: str) -> Iterator[None]:
    """The one place the hop's failures become the spec's errors."""
    try:
        yield
    except UpstreamTimeout as exc:
        raise SandcellError(
            ErrorCode.SANDBOX_TIMEOUT,
            "the sandbox did not answer in time",
            {"sandbox_id": sandbox_id},
        ) from exc
    except UpstreamError as exc:
        raise SandcellError(
            ErrorCode.SANDBOX_UNREACHABLE,
            "the sandbox is unreachable",
            {"sandbox_id": sandbox_id},
        ) from exc


def _head(request: Request, target: str, host: bytes, token: str, body: bytes | None) -> bytes:
    """The daemon's request head: the client's end-to-end headers, the token, the framing."""
    headers: Headers = [(n, v) for n, v in request.scope["headers"] if n not in HOP_BY_HOP]
    headers.append((b"authorization", b"Bearer " + token.encode()))
    length = len(body) if body is not None else declared_length(request)
    if length is None:
        headers.append((b"transfer-encoding", b"chunked"))
    else:
        headers.append((b"content-length", b"%d" % length))
    try:
        return request_head(request.method, target.encode("latin-1"), host, headers)
    except ValueError as exc:
        raise SandcellError(ErrorCode.BAD_REQUEST, "invalid request head") from exc


def _answer(pool: Pool, conn: Connection, timeout: float | None) -> Response:
    """The daemon's answer to the user: buffered when it is already whole, else relayed."""
    if conn.complete:
        status, headers, data = conn.status, conn.headers, conn.body()
        pool.release(conn)
        response = Response(data, status_code=status)
        relayed = [(n, v) for n, v in headers if n not in NOT_RELAYED and n != b"content-length"]
        response.raw_headers[:0] = relayed  # before the length Starlette computed
        return response
    return Relayed(pool, conn, timeout)


class Relayed(StreamingResponse):
    """The daemon's answer as it comes. A client that goes away closes the connection to the
    daemon, which ends the relay: one watcher task, where Starlette's streaming response
    runs a task group with a cancel scope per response."""

    def __init__(self, pool: Pool, conn: Connection, timeout: float | None) -> None:
        super().__init__(
            _relay(conn, timeout), conn.status, background=BackgroundTask(_end, pool, conn)
        )
        self.raw_headers = [(n, v) for n, v in conn.headers if n not in NOT_RELAYED]
        self.conn = conn

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watcher = asyncio.ensure_future(_on_disconnect(receive, self.conn.close))
        try:
            await self.stream_response(send)
        finally:
            watcher.cancel()
            await self.background()  # type: ignore[misc]


async def _on_disconnect(receive: Receive, then: Callable[[], None]) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass  # the rest of a request body the daemon did not wait for
    then()


async def _relay(conn: Connection, timeout: float | None) -> AsyncIterator[bytes]:
    try:
        while (chunk := await conn.next_chunk(timeout)) is not None:
            yield chunk
    except UpstreamError:
        # Headers are gone already: the client sees a truncated body, not a hang.
        return


async def _end(pool: Pool, conn: Connection) -> None:
    """After a relayed answer: its connection back to the pool, or closed if cut short."""
    pool.release(conn)


def _daemon_target(request: Request, rest: str) -> str:
    """The daemon's path for `rest`, kept byte-for-byte as the client encoded it.

    Only /v1/... of the daemon is reachable: dot segments (which a server may resolve, e.g.
    to /init) and slashes encoded into the sandbox id are refused.
    """
    if any(segment in (".", "..") for segment in rest.split("/")):
        raise SandcellError(ErrorCode.BAD_REQUEST, "dot segments are not allowed in the path")
    raw = request.scope.get("raw_path") or request.scope["path"].encode()
    prefix = f"/v1/sandboxes/{request.path_params['sandbox_id']}/".encode()
    if not raw.startswith(prefix):
        raise SandcellError(ErrorCode.BAD_REQUEST, "the path is not a plain sandbox path")
    query = request.scope.get("query_string", b"")
    target = b"/v1/" + raw[len(prefix) :] + (b"?" + query if query else b"")
    return target.decode("latin-1")


async def _body(request: Request, rest: str) -> tuple[bytes | None, AsyncIterator[bytes] | None]:
    """(the whole body, to bind in the token) or (None, the stream to send on as it comes)."""
    length = declared_length(request)
    streamed = (
        request.method == "PUT"
        and rest == "files"
        and (length is None or length > STREAM_UPLOADS_FROM)
    )
    if streamed:
        return None, request.stream()
    return await read_body(request, BUFFER_LIMIT), None


# Requests that carry their own timeout_s, and its default.
TIMED = {"exec": 60.0, "code/run": 300.0}


def _read_timeout(rest: str, body: bytes | None) -> float | None:
    """How long the daemon may take: an exec's (or a code run's) own timeout plus a margin,
    else a default. The body is the client's and unchecked yet: anything odd falls back to
    the default (the daemon answers it with a 400)."""
    if rest.startswith("processes/") and rest.endswith("/output"):
        return None  # following a process's output may stay quiet for as long as it runs
    if rest not in TIMED or not body:
        return DEFAULT_READ_TIMEOUT_S
    default = TIMED[rest]
    try:
        timeout = float(json.loads(body).get("timeout_s", default))
    except (ValueError, AttributeError, TypeError, RecursionError):
        timeout = default
    if not math.isfinite(timeout):
        timeout = default
    return min(max(timeout, 0.0), MAX_EXEC_TIMEOUT_S) + EXEC_TIMEOUT_MARGIN_S
