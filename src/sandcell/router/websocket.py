"""WebSocket upgrades to a sandbox's daemon (SPEC §5, §9): `/v1/sandboxes/{id}/<rest>`.

The user's upgrade is authenticated like any request; the router then opens its own
upgrade to the daemon's `/v1/<rest>`, signed with a fresh request token bound to
`htm=GET` and that path. Only then is the user's upgrade accepted, so every refusal (no
key, another principal's sandbox, a daemon's 401 or 404) is a plain HTTP error. Frames
then flow both ways as they come; when either side goes away, both are closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

from starlette.responses import Response
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect
from websockets.asyncio.client import ClientConnection, connect, unix_connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from sandcell import tokens
from sandcell.errors import ErrorCode, SandcellError
from sandcell.http.errors import error_response
from sandcell.router import persistence
from sandcell.router.proxy import CONNECT_TIMEOUT_S, _daemon_target
from sandcell.store import SandboxRecord

log = logging.getLogger("sandcell.router")
DAEMON_HOST = "sandcell-daemon"
NORMAL_CLOSURE = 1000
TOUCH_EVERY_S = 10.0
MAX_SESSIONS_PER_KEY = 64
MAX_SESSIONS = 1024


class _Sessions:
    """Open sessions hold two connections each: bounded per key and in all, so that no key
    can exhaust the router's file descriptors."""

    def __init__(self) -> None:
        self.by_key: Counter[str] = Counter()

    @contextlib.contextmanager
    def hold(self, key: str) -> Iterator[None]:
        if self.by_key[key] >= MAX_SESSIONS_PER_KEY or self.by_key.total() >= MAX_SESSIONS:
            raise SandcellError(
                ErrorCode.RATE_LIMITED,
                "too many open WebSocket sessions",
                {"per_key": MAX_SESSIONS_PER_KEY, "total": MAX_SESSIONS},
                headers={"Retry-After": "5"},
            )
        self.by_key[key] += 1
        try:
            yield
        finally:
            self.by_key[key] -= 1
            if not self.by_key[key]:
                del self.by_key[key]


def _sessions(websocket: WebSocket) -> _Sessions:
    state = websocket.app.state
    if getattr(state, "websocket_sessions", None) is None:
        state.websocket_sessions = _Sessions()
    return state.websocket_sessions


async def proxy_websocket(websocket: WebSocket) -> None:
    async with contextlib.AsyncExitStack() as stack:
        try:
            upstream, activity = await _open_upstream(websocket, stack)
        except SandcellError as exc:
            await websocket.send_denial_response(error_response(exc))
            return
        except InvalidStatus as exc:  # the daemon refused: its answer is the user's
            answer = exc.response
            await websocket.send_denial_response(
                Response(
                    bytes(answer.body or b""),
                    answer.status_code,
                    media_type=answer.headers.get("content-type", "application/json"),
                )
            )
            return
        await websocket.accept()
        await _relay(websocket, upstream, activity)


class _Activity:
    """Frames either way count as the sandbox's activity, so a long terminal session is not
    reaped as idle (one store write per TOUCH_EVERY_S at most, or a third of the idle
    timeout when that is shorter)."""

    def __init__(self, store: Any, record: SandboxRecord) -> None:
        self.store = store
        self.sandbox_id = record.id
        self.every_s = min(TOUCH_EVERY_S, record.idle_timeout_s / 3)
        self._last = time.monotonic()

    async def seen(self) -> None:
        now = time.monotonic()
        if now - self._last >= self.every_s:
            self._last = now
            try:
                await self.store.touch(self.sandbox_id, time.time())
            except Exception as exc:  # a store outage must not cut a live session
                log.warning("could not record activity of %s: %s", self.sandbox_id, exc)


async def _open_upstream(
    websocket: WebSocket, stack: contextlib.AsyncExitStack
) -> tuple[ClientConnection, _Activity]:
    """The daemon's side of the session (closed with `stack`), before the user's upgrade."""
    r = websocket.app.state.router
    principal, record = await r.owned(websocket)
    stack.enter_context(_sessions(websocket).hold(principal.name))
    if record.state != "running":
        record = await persistence.wake(r, record)  # a paused one resumes, or 409
    target = _daemon_target(websocket, websocket.path_params["rest"])  # type: ignore[arg-type]
    key = await r.proxy.signing_key(record.id)
    token = tokens.mint_request_token(key, record.id, "GET", target)
    await r.store.touch(record.id, time.time())
    try:
        upstream = await _connect(record.endpoint, target, {"authorization": f"Bearer {token}"})
    except InvalidStatus:
        raise
    except (OSError, TimeoutError, InvalidHandshake) as exc:
        raise SandcellError(
            ErrorCode.SANDBOX_UNREACHABLE,
            "the sandbox is unreachable",
            {"sandbox_id": record.id},
        ) from exc
    await stack.enter_async_context(upstream)
    return upstream, _Activity(r.store, record)


def _connect(
    endpoint: dict[str, Any], target: str, headers: dict[str, str]
) -> Any:  # an awaitable ClientConnection
    options: dict[str, Any] = {
        "additional_headers": headers,
        "open_timeout": CONNECT_TIMEOUT_S,
        "compression": None,  # keystrokes: latency over bytes
        "max_size": None,  # the daemon bounds what it sends
    }
    if "uds" in endpoint:
        return unix_connect(str(endpoint["uds"]), uri=f"ws://{DAEMON_HOST}{target}", **options)
    host = str(endpoint["host"])
    netloc = f"[{host}]" if ":" in host else host
    return connect(f"ws://{netloc}:{endpoint['port']}{target}", **options)


async def _relay(websocket: WebSocket, upstream: ClientConnection, activity: _Activity) -> None:
    inbound = asyncio.ensure_future(_user_to_daemon(websocket, upstream, activity))
    outbound = asyncio.ensure_future(_daemon_to_user(websocket, upstream, activity))
    try:
        await asyncio.wait({inbound, outbound}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (inbound, outbound):
            task.cancel()
        code = upstream.close_code or NORMAL_CLOSURE
        with contextlib.suppress(Exception):
            await upstream.close()
        with contextlib.suppress(Exception):
            await websocket.close(code if code != 1006 else NORMAL_CLOSURE)


async def _user_to_daemon(
    websocket: WebSocket, upstream: ClientConnection, activity: _Activity
) -> None:
    with contextlib.suppress(WebSocketDisconnect, ConnectionClosed):
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                return
            await activity.seen()
            data = message.get("bytes")
            if data is None:
                data = message.get("text")
            if data is not None:
                await upstream.send(data)


async def _daemon_to_user(
    websocket: WebSocket, upstream: ClientConnection, activity: _Activity
) -> None:
    with contextlib.suppress(ConnectionClosed, WebSocketDisconnect, RuntimeError):
        async for message in upstream:
            await activity.seen()
            if isinstance(message, bytes):
                await websocket.send_bytes(message)
            else:
                await websocket.send_text(message)


ROUTE = WebSocketRoute("/v1/sandboxes/{sandbox_id}/{rest:path}", proxy_websocket)
