"""The node API's server (SPEC §18): TLS 1.3 with the node's certificate, answering only
routers of its cluster (the context of `sandcell.cluster.trust` checks that during the
handshake, before a byte of a request is read), one request per connection: a `CONNECT` to a
cell (`relay`) or a control call (`control`).

Each connection is a protocol, not a pair of streams: a stream reads ahead of the request
into a buffer the relay could not hand on, and the relay (transport to transport) is what
every request of a sandbox on a node goes through."""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import Any

from sandcell.errors import ErrorCode, ServiceError
from sandcell.manager.backend import Backend
from sandcell.store import Store

from .control import Control
from .relay import sandbox_of, socket_of, splice
from .wire import MAX_BODY_BYTES, REQUEST_TIMEOUT_S, Request, answer, bad, parse, refusal

log = logging.getLogger("sandcell.node")
HANDSHAKE_TIMEOUT_S = 10.0  # a client that never finishes its handshake holds nothing longer


class NodeApi:
    """Serves on `start`, and on `close` stops accepting and ends every connection (a relay
    included: the router's pool dials again, through a node that answers)."""

    def __init__(self, store: Store, backend: Backend, control: Control) -> None:
        self.store = store
        self.backend = backend
        self.control = control
        self._server: asyncio.Server | None = None
        self.sessions: set[_Session] = set()
        self.tasks: set[asyncio.Task[None]] = set()

    async def start(self, host: str, port: int, context: ssl.SSLContext) -> int:
        """Listens on host:port (port 0: any free one); returns the port bound."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Session(self),
            host,
            port,
            ssl=context,
            ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S,
        )
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for session in list(self.sessions):
            session.transport.close()
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def serve(self, session: _Session, request: Request) -> None:
        """One request: the tunnel it asks for, or its control call's answer."""
        try:
            if request.method == "CONNECT":
                sandbox_id = sandbox_of(request.target)
                uds = await socket_of(self.store, self.backend, sandbox_id)
                await splice(session.transport, session.take_leftover, uds, sandbox_id)
                return
            status, payload = await self.control.call(request)
            session.finish(answer(status, payload))
        except ServiceError as exc:
            session.finish(refusal(exc))
        except Exception:
            log.exception("node API call failed")
            session.finish(refusal(ServiceError(ErrorCode.INTERNAL, "internal error")))
        finally:
            self.sessions.discard(session)  # a tunnel's transport left the session's protocol


class _Session(asyncio.Protocol):
    """One connection until its request is whole; then its reading pauses and `NodeApi.serve`
    takes it (a tunnel moves the transport to the relay's protocols)."""

    def __init__(self, api: NodeApi) -> None:
        self.api = api
        self.transport: Any = None
        self._buffer = b""
        self._taken = False
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.api.sessions.add(self)
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(REQUEST_TIMEOUT_S, self._late)

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if self._taken:  # read before the pause took hold: the tunnel's first bytes
            return
        try:
            parsed = parse(self._buffer)
        except ServiceError as exc:
            self.finish(refusal(exc))
            return
        if parsed is None:
            if len(self._buffer) > 2 * MAX_BODY_BYTES:  # parse refuses long before this
                self.finish(refusal(bad("the request is too large")))
            return
        request, used = parsed
        self._buffer = self._buffer[used:]
        self._taken = True
        self._stop_timer()
        self.transport.pause_reading()
        task = asyncio.get_running_loop().create_task(self.api.serve(self, request))
        self.api.tasks.add(task)
        task.add_done_callback(self.api.tasks.discard)

    def take_leftover(self) -> bytes:
        leftover, self._buffer = self._buffer, b""
        return leftover

    def finish(self, data: bytes) -> None:
        """Answers and ends the connection (unless the router has gone already)."""
        if not self.transport.is_closing():
            self.transport.write(data)
            self.transport.close()

    def _late(self) -> None:
        self.finish(refusal(bad("no whole request in time")))

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def connection_lost(self, exc: Exception | None) -> None:
        # A control call under way runs to its end (a create half done is worse than an
        # answer nobody reads); only a stopping node cancels it.
        self._stop_timer()
        self.api.sessions.discard(self)
