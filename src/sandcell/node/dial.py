"""A router's side of the relay (SPEC §18): mutual TLS to the node, `CONNECT
/cells/<sandbox_id>`, and once the node answers 200 the connection is the daemon's, handed to
the caller's protocol, which sends its ordinary signed HTTP/1.1 request.

`cellapi.client.dialer` takes this path for an endpoint `{"node": "host:port", "sandbox":
id}`, so every entry point (the API, the façades, WebSocket attach, the health probe) reaches
a cell on a node unchanged. The router's certificate is loaded once per process with
`configure`; without it a dial fails, as an unreachable sandbox.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sandcell.cluster import trust
from sandcell.http.upstream import Dial, UpstreamError

MAX_ANSWER_BYTES = 16 * 1024
_context: ssl.SSLContext | None = None


def configure(member_dir: Path | None) -> None:
    """Dial nodes as the router whose files are in `member_dir` (None: dial none)."""
    global _context
    _context = None if member_dir is None else trust.client_context(member_dir, "router")


def host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


class _Opening(asyncio.Protocol):
    """Reads the node's answer to the CONNECT, and nothing past it."""

    def __init__(self, request: bytes) -> None:
        self.request = request
        self.answered: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._buffer = b""

    def connection_made(self, transport: Any) -> None:
        transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        whole = b"\r\n\r\n" in self._buffer or len(self._buffer) > MAX_ANSWER_BYTES
        if whole and not self.answered.done():
            self.answered.set_result(self._buffer)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.answered.done():
            self.answered.set_result(self._buffer)


def _refused(address: str, answer: bytes) -> UpstreamError:
    head, _, body = answer.partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0].decode("latin-1", "replace")
    try:
        message = json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = "no reason given"
    return UpstreamError(f"node {address} refused the relay: {status}: {message}")


def node_dialer(address: str, sandbox_id: str) -> Dial:
    host, port = host_port(address)
    request = f"CONNECT /cells/{sandbox_id} HTTP/1.1\r\nhost: {address}\r\n\r\n".encode()

    async def dial(factory: Callable[[], asyncio.Protocol]) -> tuple[Any, Any]:
        if _context is None:
            raise UpstreamError(f"no router certificate to dial node {address} with")
        loop = asyncio.get_running_loop()
        transport, opening = await loop.create_connection(
            lambda: _Opening(request), host, port, ssl=_context, server_hostname=host
        )
        try:
            answer = await opening.answered
        except BaseException:
            transport.close()
            raise
        if not answer.startswith(b"HTTP/1.1 200 ") or not answer.endswith(b"\r\n\r\n"):
            transport.close()
            raise _refused(address, answer)
        protocol = factory()
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        return transport, protocol

    return dial
