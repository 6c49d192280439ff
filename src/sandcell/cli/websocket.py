"""A blocking WebSocket client for `sandcell exec -it`: wsproto's state machine (the one
WebSocket library of sandcell, as on the router and the daemon) over one socket.

One thread reads (`messages`), another writes (`send`): a lock keeps wsproto's state and
the socket's writes in order between them. Pings are answered as they arrive.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from collections.abc import Iterator, Mapping
from urllib.parse import urlsplit

from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Event,
    Ping,
    RejectConnection,
    RejectData,
    Request,
    TextMessage,
)
from wsproto.utilities import LocalProtocolError, RemoteProtocolError

CHUNK = 65_536
MAX_REFUSAL_BODY = 65_536
NORMAL_CLOSURE = 1000


class Refused(Exception):
    """The server answered the upgrade with HTTP instead: its status, headers and body."""

    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        super().__init__(f"the WebSocket upgrade was refused (HTTP {status})")
        self.status, self.headers, self.body = status, headers, body


class Closed(Exception):
    """The connection ended without a close handshake."""


class WebSocket:
    def __init__(self, sock: socket.socket, conn: WSConnection) -> None:
        self._sock = sock
        self._ws = conn
        self._lock = threading.Lock()
        self._pending: list[Event] = []

    def send(self, data: bytes | str) -> None:
        event = TextMessage(data=data) if isinstance(data, str) else BytesMessage(data=data)
        self._send(event)

    def _send(self, event: Event) -> None:
        with self._lock:
            self._sock.sendall(self._ws.send(event))

    def messages(self) -> Iterator[bytes | str]:
        """Each whole message until the server closes; `Closed` if it just goes away."""
        parts: list[bytes | str] = []
        while (event := self._next()) is not None:
            if isinstance(event, Ping):
                self._send(event.response())
            elif isinstance(event, CloseConnection):
                with contextlib.suppress(LocalProtocolError, OSError):  # already closing
                    self._send(event.response())
                return
            elif isinstance(event, TextMessage | BytesMessage):
                parts.append(event.data if isinstance(event.data, str) else bytes(event.data))
                if event.message_finished:
                    yield _joined(parts)
                    parts = []
        raise Closed("the connection closed without a close frame")

    def _next(self) -> Event | None:
        while not self._pending:
            data = self._sock.recv(CHUNK)
            with self._lock:
                self._ws.receive_data(data or None)
                self._pending.extend(self._ws.events())
            if not data and not self._pending:
                return None
        return self._pending.pop(0)

    def close(self) -> None:
        with contextlib.suppress(LocalProtocolError, OSError):  # the other side closed first
            self._send(CloseConnection(code=NORMAL_CLOSURE))
        self._sock.close()


def _joined(parts: list[bytes | str]) -> bytes | str:
    if isinstance(parts[0], str):
        return "".join(p for p in parts if isinstance(p, str))
    return b"".join(p for p in parts if isinstance(p, bytes))


def connect(url: str, headers: Mapping[str, str], timeout_s: float) -> WebSocket:
    """An open WebSocket to `url` (ws:// or wss://); `Refused` with the server's answer if it
    answers the upgrade with anything but 101, `OSError` if it cannot be reached."""
    parts = urlsplit(url)
    secure = parts.scheme == "wss"
    host = parts.hostname or "localhost"
    port = parts.port or (443 if secure else 80)
    sock = socket.create_connection((host, port), timeout_s)
    try:
        if secure:
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = WSConnection(ConnectionType.CLIENT)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        extra = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        sock.sendall(conn.send(Request(host=parts.netloc, target=target, extra_headers=extra)))
        ws = WebSocket(sock, conn)
        _handshake(ws)
    except BaseException:
        sock.close()
        raise
    sock.settimeout(None)  # a terminal may stay quiet for as long as its user does
    return ws


def _handshake(ws: WebSocket) -> None:
    try:
        event = ws._next()
        if isinstance(event, AcceptConnection):
            return
        if not isinstance(event, RejectConnection):
            raise OSError("the server spoke no WebSocket")
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in event.headers}
        body = b""
        while event.has_body and len(body) <= MAX_REFUSAL_BODY:
            part = ws._next()
            if not isinstance(part, RejectData):
                break
            body += part.data
            if part.body_finished:
                break
        raise Refused(event.status_code, headers, body[:MAX_REFUSAL_BODY])
    except RemoteProtocolError as exc:
        raise OSError(f"the WebSocket handshake failed: {exc}") from None
