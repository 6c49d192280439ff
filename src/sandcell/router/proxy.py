"""Forwarding a user's request to a sandbox's daemon, signed with a fresh request JWT.

Small bodies are buffered and bound to the token (`bsh`); file uploads stream through
untouched in both directions, so a large file is never held whole in memory.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from sandcell import tokens
from sandcell.cellapi.client import async_transport
from sandcell.errors import ErrorCode, SandcellError
from sandcell.http.bodies import declared_length, read_body
from sandcell.store import SandboxRecord, Store

BUFFER_LIMIT = 8 * 1_048_576  # the daemon's own JSON limit
STREAM_UPLOADS_FROM = 1_048_576
CONNECT_TIMEOUT_S = 2.0
DEFAULT_READ_TIMEOUT_S = 120.0
EXEC_TIMEOUT_MARGIN_S = 30.0
MAX_EXEC_TIMEOUT_S = 86_400.0
CLOSE_GRACE_S = 120.0
# The router's own server sets these on every response: not copied from the daemon's.
SERVER_HEADERS = {"date", "server"}
HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailers",
    "transfer-encoding",
    "upgrade",
    "host",
    "authorization",
    "content-length",
}


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


TransportFactory = Callable[[dict[str, Any]], tuple[httpx.AsyncBaseTransport, str]]


class DaemonProxy:
    """`transport_for` maps a daemon endpoint to an httpx transport and base URL; tests pass
    one that serves a daemon app in-process (`httpx.ASGITransport`)."""

    def __init__(
        self,
        store: Store,
        key_cache_size: int = 4096,
        max_clients: int = 1024,
        transport_for: TransportFactory = async_transport,
    ) -> None:
        self.store = store
        self._transport_for = transport_for
        self._keys = _Lru(key_cache_size)
        self._clients = _Lru(max_clients)

    async def close(self) -> None:
        for client in self._clients.values():
            await client.aclose()
        self._clients.clear()

    def forget(self, record: SandboxRecord) -> None:
        """Drops what is cached for a deleted sandbox: its key and its connection pool."""
        self._keys.pop(record.id, None)
        client = self._clients.pop(_ident(record.endpoint), None)
        if client is not None:
            _close_later(client)

    async def _session_key(self, sandbox_id: str) -> tokens.PrivateKey:
        key = self._keys.get_fresh(sandbox_id)
        if key is None:
            pem = await self.store.get_session_key(sandbox_id)
            if pem is None:
                raise SandcellError(ErrorCode.SANDBOX_NOT_FOUND, f"sandbox {sandbox_id} not found")
            key = tokens.load_private_key(pem)
            self._keys.put(sandbox_id, key)
        return key

    def _client(self, endpoint: dict[str, Any]) -> httpx.AsyncClient:
        ident = _ident(endpoint)
        client = self._clients.get_fresh(ident)
        if client is None:
            transport, base = self._transport_for(endpoint)
            client = httpx.AsyncClient(transport=transport, base_url=base)
            evicted = self._clients.put(ident, client)
            if evicted is not None:
                _close_later(evicted)
        return client

    async def forward(
        self, request: Request, record: SandboxRecord, rest: str, target: str | None = None
    ) -> Response:
        """`target` is the daemon's path when the request's own path is not a sandbox path
        (a preview URL); by default it is derived from the request."""
        key = await self._session_key(record.id)
        target = target or _daemon_target(request, rest)
        body, content = await _body(request, rest)
        token = tokens.mint_request_token(key, record.id, request.method, target, body)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        headers["authorization"] = f"Bearer {token}"
        if (length := declared_length(request)) is not None:
            headers["content-length"] = str(length)
        client = self._client(record.endpoint)
        upstream = client.build_request(
            request.method,
            target,
            headers=headers,
            content=content,
            timeout=httpx.Timeout(_read_timeout(rest, body), connect=CONNECT_TIMEOUT_S),
        )
        try:
            response = await client.send(upstream, stream=True)
        except httpx.TimeoutException as exc:
            raise SandcellError(
                ErrorCode.SANDBOX_TIMEOUT,
                "the sandbox did not answer in time",
                {"sandbox_id": record.id},
            ) from exc
        except httpx.HTTPError as exc:
            raise SandcellError(
                ErrorCode.SANDBOX_UNREACHABLE,
                "the sandbox is unreachable",
                {"sandbox_id": record.id},
            ) from exc
        out_headers = {
            k: v
            for k, v in response.headers.items()
            if k.lower() not in (HOP_BY_HOP - {"content-length"}) | SERVER_HEADERS
        }
        return StreamingResponse(
            _relay(response, record.id),
            status_code=response.status_code,
            headers=out_headers,
            background=BackgroundTask(response.aclose),
        )


def _ident(endpoint: dict[str, Any]) -> str:
    return json.dumps(endpoint, sort_keys=True)


def _close_later(client: httpx.AsyncClient) -> None:
    """Closes a pool no longer handed out, once requests still streaming on it are done."""
    loop = asyncio.get_running_loop()
    loop.call_later(CLOSE_GRACE_S, lambda: loop.create_task(client.aclose()))


async def _relay(response: httpx.Response, sandbox_id: str) -> AsyncIterator[bytes]:
    try:
        async for chunk in response.aiter_raw():
            yield chunk
    except httpx.HTTPError:
        # Headers are gone already: the client sees a truncated body, not a hang.
        return


def _daemon_target(request: Request, rest: str) -> str:
    """The daemon's path for `rest`, kept byte-for-byte as the client encoded it.

    Only /v1/... of the daemon is reachable: dot segments (which the HTTP client would
    resolve, e.g. to /init) and slashes encoded into the sandbox id are refused.
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


async def _body(request: Request, rest: str) -> tuple[bytes | None, Any]:
    """(the bytes to bind in the token or None, what to send upstream)."""
    length = declared_length(request)
    streamed = (
        request.method == "PUT"
        and rest == "files"
        and (length is None or length > STREAM_UPLOADS_FROM)
    )
    if streamed:
        return None, request.stream()
    body = await read_body(request, BUFFER_LIMIT)
    return body, body


def _read_timeout(rest: str, body: bytes | None) -> float:
    """How long the daemon may take: an exec's own timeout plus a margin, else a default.
    The body is the client's and unchecked yet: anything odd falls back to the default
    (the daemon answers it with a 400)."""
    if rest != "exec" or not body:
        return DEFAULT_READ_TIMEOUT_S
    try:
        timeout = float(json.loads(body).get("timeout_s", 60))
    except (ValueError, AttributeError, TypeError, RecursionError):
        timeout = 60.0
    if not math.isfinite(timeout):
        timeout = 60.0
    return min(max(timeout, 0.0), MAX_EXEC_TIMEOUT_S) + EXEC_TIMEOUT_MARGIN_S
