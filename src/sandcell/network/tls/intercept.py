"""The relay for a CONNECT towards a host that one of the sandbox's secrets names.

The proxy verifies the real server first (its own TLS connection), then answers the CONNECT
and terminates the cell's TLS with a leaf for the host signed by the sandbox's CA (ALPN
`http/1.1` only); `exchange` relays the requests and responses between the two.

The event loop accepts and answers the CONNECT; the connection then leaves it: both TCP
sockets are taken out of their transports (a descriptor of their own, the transports
closed) and served on blocking sockets in a thread of `Relays` (bounded; past the bound
the CONNECT is refused with a 503). There OpenSSL reads and writes each socket itself, with
no memory BIO to copy every byte into and out of, and lets go of the GIL while it does.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import socket
import ssl
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, cast

import h11

from sandcell.network.policy import Decision
from sandcell.network.tls.blocking import Side
from sandcell.network.tls.exchange import Exchange
from sandcell.network.tls.relays import Relay
from sandcell.network.tls.rewrite import HostRules
from sandcell.network.tls.substitution import Substitution
from sandcell.secrets.bindings import Decision as Use

if TYPE_CHECKING:
    from sandcell.network.egress import EgressService

log = logging.getLogger("sandcell.egress.secrets")
Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def relay(
    service: EgressService,
    substitution: Substitution,
    sandbox_id: str,
    rules: HostRules,
    decision: Decision,
    port: int,
    cell: Streams,
    established: Callable[[], Awaitable[None]],
    refuse: Callable[[int, str], Awaitable[None]],
    early: bytes = b"",
) -> None:
    """Serves one intercepted CONNECT: `established` answers it (HTTP 200 or SOCKS success),
    `refuse` answers it with a failure (the upstream could not be verified, say)."""
    from sandcell.network.egress import Refused

    relays = substitution.relays
    held = relays.reserve(sandbox_id)
    if isinstance(held, str):
        log.warning("egress sandbox=%s host=%s: refused: %s", sandbox_id, rules.host, held)
        await refuse(503, held)
        return
    try:
        try:
            upstream = await _verified(service, substitution, rules.host, decision, port, held)
        except Refused as exc:
            await refuse(502, exc.reason)
            return
        if early:  # the client spoke before the CONNECT's answer: not a TLS client
            await refuse(400, "the TLS handshake must follow the CONNECT's answer")
            return
        hosts = {h for b in rules.own for h in b.hosts}
        context = substitution.authorities.of(sandbox_id, hosts).server_context(rules.host)
        plain = await _taken(cell, held, established)
        if plain is None:  # bytes came before the CONNECT's answer (or the client went)
            await refuse(400, "the TLS handshake must follow the CONNECT's answer")
            return
        idle = service.limits.idle_timeout_s
        handshake_s = service.limits.head_timeout_s
        bytes_out = service.metrics.bytes.labels("out").inc
        bytes_in = service.metrics.bytes.labels("in").inc

        loop = asyncio.get_running_loop()

        def record(sandbox: str, secret: str, host: str, decision: Use) -> None:
            # The recorder is the loop's (the audit trail wakes an asyncio.Event).
            loop.call_soon_threadsafe(substitution.record, sandbox, secret, host, decision)

        def serve() -> None:
            tls = held.swap(
                plain, context.wrap_socket(plain, server_side=True, do_handshake_on_connect=False)
            )
            try:
                tls.settimeout(handshake_s)
                tls.do_handshake()
                cell_side = Side(h11.SERVER, tls, idle, bytes_in)
                upstream_side = Side(h11.CLIENT, upstream, idle, bytes_out)
                Exchange(record, sandbox_id, rules, cell_side, upstream_side).run()
            finally:
                _goodbye(tls)
                _goodbye(upstream)

        await relays.run(held, serve, f"sandcell-tls-relay-{sandbox_id}")
    except (ssl.SSLError, h11.ProtocolError, OSError) as exc:
        log.info(
            "egress sandbox=%s host=%s: intercepted connection ended: %s",
            sandbox_id,
            rules.host,
            exc or type(exc).__name__,
        )
    finally:
        relays.release(held)


async def _verified(
    service: EgressService,
    substitution: Substitution,
    host: str,
    decision: Decision,
    port: int,
    held: Relay,
) -> ssl.SSLSocket:
    """A TLS connection to the first checked address whose server is verified for `host`
    (SNI, name, expiry, chain: OpenSSL's checks), handshaken in the relay's thread."""
    from sandcell.network.egress import Refused, connect_failure

    last = "cannot connect to no address"
    context = substitution.upstream
    timeout_s = service.limits.connect_timeout_s
    for address in decision.addresses:
        try:
            streams = await service.connect(
                dataclasses.replace(decision, addresses=(address,)), port
            )
        except Refused as exc:
            last = exc.reason
            continue
        plain = await _taken(streams, held)
        if plain is None:
            last = f"cannot connect to {address}:{port}: the server spoke first"
            continue

        def handshake(plain: socket.socket = plain) -> ssl.SSLSocket:
            tls = held.swap(
                plain,
                context.wrap_socket(plain, server_hostname=host, do_handshake_on_connect=False),
            )
            try:
                tls.settimeout(timeout_s)
                tls.do_handshake()
            except BaseException:
                held.drop(tls)
                raise
            return tls

        try:
            return await substitution.relays.run(held, handshake, "sandcell-tls-verify")
        except OSError as exc:  # ssl.SSLError too
            last = f"cannot connect to {connect_failure(address, port, exc)}"
    raise Refused(last)


async def _taken(
    streams: Streams, held: Relay, answer: Callable[[], Awaitable[None]] | None = None
) -> socket.socket | None:
    """The connection's socket, out of its transport: reading stops, `answer` is sent (the
    CONNECT's), and the transport closes over a descriptor of its own. None when bytes had
    come past what was answered (they would be lost) or the peer has gone."""
    reader, writer = streams
    transport = cast(asyncio.Transport, writer.transport)  # uvloop's: no subclass of asyncio's
    transport.pause_reading()
    reader.feed_eof()  # it gets nothing more: what it holds is read without waiting
    if await reader.read() or transport.is_closing():
        return None
    if answer is not None:
        await answer()
    raw = writer.get_extra_info("socket")
    if raw is None:
        return None
    sock = held.own(socket.socket(fileno=os.dup(raw.fileno())))
    writer.close()
    with contextlib.suppress(Exception):
        await writer.wait_closed()
    return sock


def _goodbye(sock: ssl.SSLSocket) -> None:
    """A TLS close_notify, if it can leave at once (a client reading to the end of the
    connection sees an end, not a truncation); the socket closes with its relay."""
    with contextlib.suppress(OSError, ValueError):
        sock.settimeout(0)
        sock.unwrap()
