"""Plain sockets for tests."""

from __future__ import annotations

import socket


def listening() -> socket.socket:
    """A TCP socket listening on an ephemeral port of the host's loopback."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock
