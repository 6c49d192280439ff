"""The node API's server (SPEC §18): TLS 1.3 with the node's certificate, answering only
routers of its cluster (the context of `sandcell.cluster.trust` checks that during the
handshake, before a byte of a request is read), one request per connection: a `CONNECT` to a
cell (`relay`) or a control call (`control`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl

from sandcell.errors import ErrorCode, ServiceError
from sandcell.manager.backend import Backend
from sandcell.store import Store

from .control import Control
from .relay import relay, sandbox_of, socket_of
from .wire import MAX_HEAD_BYTES, answer, read_request, refusal

log = logging.getLogger("sandcell.node")


class NodeApi:
    """Serves on `start`, and on `close` stops accepting and ends every connection (a relay
    included: the router's pool dials again, through a node that answers)."""

    def __init__(self, store: Store, backend: Backend, control: Control) -> None:
        self.store = store
        self.backend = backend
        self.control = control
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()

    async def start(self, host: str, port: int, context: ssl.SSLContext) -> int:
        """Listens on host:port (port 0: any free one); returns the port bound."""
        self._server = await asyncio.start_server(
            self._handle, host, port, ssl=context, limit=MAX_HEAD_BYTES
        )
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            await self._serve(reader, writer)
        finally:
            self._handlers.discard(task)
            writer.close()
            with contextlib.suppress(OSError, asyncio.CancelledError):
                await writer.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await read_request(reader)
            if request is None:
                return
            if request.method == "CONNECT":
                sandbox_id = sandbox_of(request.target)
                uds = await socket_of(self.store, self.backend, sandbox_id)
                await relay((reader, writer), uds, sandbox_id)
                return
            status, payload = await self.control.call(request)
            writer.write(answer(status, payload))
        except ServiceError as exc:
            writer.write(refusal(exc))
        except (ConnectionError, ssl.SSLError):
            return  # the router went away
        except Exception:
            log.exception("node API call failed")
            writer.write(refusal(ServiceError(ErrorCode.INTERNAL, "internal error")))
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            await writer.drain()
