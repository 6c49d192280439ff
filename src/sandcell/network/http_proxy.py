"""The HTTP egress proxy: `CONNECT host:port` tunnels and absolute-form forward requests.

h11 parses the request head strictly; what follows the head (a tunnel's bytes, a request body in
whatever framing the client chose) is relayed raw, so nothing is buffered beyond one chunk.
Forwarded requests get `Connection: close`: one request per upstream connection keeps every
request on a connection whose destination was checked. A CONNECT towards a host that one of the
sandbox's secrets names is not a tunnel: `tls.intercept` relays it (SPEC §17), and a plain
request carrying a placeholder is refused (secrets are substituted over TLS only).
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

import h11

from sandcell.network.egress import EgressService, Refused
from sandcell.network.policy import Decision, canonical_host
from sandcell.network.tls import intercept
from sandcell.network.tls.rewrite import HostRules
from sandcell.network.tls.substitution import Substitution

MAX_HEAD = 16_384
# Meant for the proxy, not the origin: never forwarded.
PROXY_HEADERS = {b"proxy-connection", b"proxy-authorization", b"connection", b"keep-alive"}


class BadRequest(Exception):
    pass


async def handle(
    service: EgressService,
    sandbox_id: str,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
) -> None:
    try:
        head, rest = await asyncio.wait_for(_read_head(reader), service.limits.head_timeout_s)
        request = _parse(head)
        host, port, origin_form = _destination(request)
    except BadRequest as exc:
        await _answer(writer, 400, str(exc))
        return
    tunnel = request.method == b"CONNECT"
    decision = await service.authorize(sandbox_id, "connect" if tunnel else "http", host, port)
    if not decision.allowed:
        await _answer(writer, 403, f"refused by the sandbox's egress policy: {decision.reason}")
        return
    if (substitution := service.substitution) is not None:
        if not tunnel:
            refusal = await substitution.plain_refusal(sandbox_id, host, head)
            if refusal is not None:
                await _answer(writer, 403, f"refused: {refusal.reason}")
                return
        elif (rules := await substitution.rules_for(sandbox_id, host, port)).intercepts:
            await _intercepted(
                service, substitution, sandbox_id, rules, decision, port, rest, (reader, writer)
            )
            return
    try:
        upstream = await service.connect(decision, port)
    except Refused as exc:
        await _answer(writer, 502, exc.reason)
        return
    if tunnel:
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
    else:
        upstream[1].write(_origin_head(request, origin_form))
    upstream[1].write(rest)
    await service.pipe((reader, writer), upstream)


async def _intercepted(
    service: EgressService,
    substitution: Substitution,
    sandbox_id: str,
    rules: HostRules,
    decision: Decision,
    port: int,
    early: bytes,
    cell: tuple[asyncio.StreamReader, asyncio.StreamWriter],
) -> None:
    """A CONNECT towards a host with secrets: the relay of `tls.intercept`, answered here."""
    writer = cell[1]

    async def established() -> None:
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await writer.drain()

    async def failed(status: int, reason: str) -> None:
        await _answer(writer, status, reason)

    await intercept.relay(
        service, substitution, sandbox_id, rules, decision, port, cell, established, failed, early
    )


async def refuse(
    service: EgressService,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    status: int,
    reason: str,
) -> None:
    """A connection past a bound: its request head is read (so the answer is not lost to a
    reset), then `status` (429 for the key's bound, 503 for the process's) with the reason."""
    await asyncio.wait_for(_read_head(reader), service.limits.head_timeout_s)
    await _answer(writer, status, f"refused: {reason}", {"retry-after": "1"})


async def _read_head(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """The request head (through the blank line) and any bytes read past it."""
    buffer = b""
    while (end := buffer.find(b"\r\n\r\n")) < 0:
        if len(buffer) > MAX_HEAD:
            raise BadRequest("request head too large")
        chunk = await reader.read(MAX_HEAD)
        if not chunk:
            raise ConnectionResetError("closed before a complete request head")
        buffer += chunk
    return buffer[: end + 4], buffer[end + 4 :]


def _parse(head: bytes) -> h11.Request:
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
    try:
        conn.receive_data(head)
        event = conn.next_event()
    except h11.RemoteProtocolError as exc:
        raise BadRequest(f"malformed request: {exc}") from None
    if not isinstance(event, h11.Request):
        raise BadRequest("malformed request")
    return event


def _destination(request: h11.Request) -> tuple[str, int, bytes]:
    """(host, port, the origin-form target to forward; empty for CONNECT). An IP literal
    comes back normalised (`[::ffff:7f00:1]` is 127.0.0.1)."""
    target = request.target.decode("ascii", "replace")
    if request.method == b"CONNECT":
        parts = urlsplit(f"//{target}")
        default = None
    else:
        parts = urlsplit(target)
        if parts.scheme != "http":
            raise BadRequest("a proxy request needs an absolute http:// URL (or CONNECT)")
        default = 80
    try:
        port = parts.port or default
    except ValueError:
        raise BadRequest(f"invalid port in {target!r}") from None
    if not parts.hostname or port is None:
        raise BadRequest(f"{target!r} names no host and port")
    path = parts.path or "/"
    origin = (path + (f"?{parts.query}" if parts.query else "")).encode("ascii", "replace")
    return canonical_host(parts.hostname), port, origin


def _origin_head(request: h11.Request, target: bytes) -> bytes:
    lines = [request.method + b" " + target + b" HTTP/1.1"]
    lines += [name + b": " + value for name, value in request.headers if name not in PROXY_HEADERS]
    lines.append(b"connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n"


PHRASES = {
    400: "Bad Request",
    403: "Forbidden",
    501: "Not Implemented",
    429: "Too Many Requests",
    502: "Bad Gateway",
    503: "Service Unavailable",
}


async def _answer(
    writer: asyncio.StreamWriter, status: int, reason: str, headers: dict[str, str] | None = None
) -> None:
    body = (reason + "\n").encode()
    extra = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
    writer.write(
        f"HTTP/1.1 {status} {PHRASES[status]}\r\ncontent-type: text/plain; charset=utf-8\r\n"
        f"x-sandcell-egress: refused\r\n{extra}content-length: {len(body)}\r\n"
        "connection: close\r\n\r\n".encode()
        + body
    )
    await writer.drain()
