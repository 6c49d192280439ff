"""What one HTTP hop passes on and what it keeps (RFC 9110 §7.6.1), and the one check on a
path relayed into a sandbox. Shared by the router's hop to daemons and the daemon's relay
to a port in the cell."""

from __future__ import annotations

from collections.abc import Iterable

from sandcell.errors import ErrorCode, ServiceError

Headers = list[tuple[bytes, bytes]]

# Meaningful for one connection only: never passed on, either way.
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"trailers",
        b"transfer-encoding",
        b"upgrade",
    }
)
# A request's headers that each hop sets itself: its own Host, framing and credential (the
# caller's API key or token never travels on), and the answer to a 100-continue.
NOT_FORWARDED = HOP_BY_HOP | {b"host", b"authorization", b"content-length", b"expect"}
# An answer's headers that the relaying server sets itself.
NOT_RELAYED = HOP_BY_HOP | {b"date", b"server"}


def forwarded(headers: Iterable[tuple[bytes, bytes]]) -> Headers:
    """A request's end-to-end headers (names lower-case, as ASGI gives them)."""
    return [(n, v) for n, v in headers if n.lower() not in NOT_FORWARDED]


def relayed(headers: Iterable[tuple[bytes, bytes]]) -> Headers:
    """An answer's headers to pass back (its Content-Length kept: a streamed body's)."""
    return [(n, v) for n, v in headers if n.lower() not in NOT_RELAYED]


def check_path(path: str) -> str:
    """A relative path relayed into a sandbox: dot segments (which a server may resolve, e.g.
    out of /v1/ports/… to /init) are refused."""
    if any(segment in (".", "..") for segment in path.split("/")):
        raise ServiceError(ErrorCode.BAD_REQUEST, "dot segments are not allowed in the path")
    return path


def request_target_bytes(target: str) -> bytes:
    """A request target as it goes on the wire (kept byte for byte as the client sent it)."""
    return target.encode("latin-1")
