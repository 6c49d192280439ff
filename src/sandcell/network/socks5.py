"""The SOCKS5 egress proxy (RFC 1928): no authentication, CONNECT only.

The protocol is small enough to read directly; every field is length-checked and anything
unexpected ends the connection with the matching reply code, never an exception.
"""

from __future__ import annotations

import asyncio
import ipaddress
import struct

from sandcell.network.egress import EgressService, Refused
from sandcell.network.policy import canonical_host
from sandcell.network.tls import intercept

VERSION = 5
NO_AUTH, NO_ACCEPTABLE = 0x00, 0xFF
CMD_CONNECT = 0x01
ATYP_IPV4, ATYP_DOMAIN, ATYP_IPV6 = 0x01, 0x03, 0x04
# Replies
SUCCEEDED, GENERAL_FAILURE, NOT_ALLOWED, HOST_UNREACHABLE = 0x00, 0x01, 0x02, 0x04
CMD_NOT_SUPPORTED, ATYP_NOT_SUPPORTED = 0x07, 0x08


class ProtocolError(Exception):
    """The client broke the protocol; `reply` is the code to send, if any."""

    def __init__(self, message: str, reply: int | None = None) -> None:
        super().__init__(message)
        self.reply = reply


async def handle(
    service: EgressService,
    sandbox_id: str,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
) -> None:
    try:
        host, port = await asyncio.wait_for(
            negotiate(reader, writer), service.limits.head_timeout_s
        )
    except ProtocolError as exc:
        if exc.reply is not None:
            writer.write(reply(exc.reply))
            await writer.drain()
        return
    decision = await service.authorize(sandbox_id, "socks5", host, port)
    if not decision.allowed:
        writer.write(reply(NOT_ALLOWED))
        await writer.drain()
        return
    substitution = service.substitution
    if substitution is not None:
        rules = await substitution.rules_for(sandbox_id, host, port)
        if rules.intercepts:  # a host with secrets: the relay of SPEC §17, as over HTTP

            async def answer(code: int) -> None:
                writer.write(reply(code))
                await writer.drain()

            await intercept.relay(
                service,
                substitution,
                sandbox_id,
                rules,
                decision,
                port,
                (reader, writer),
                lambda: answer(SUCCEEDED),
                lambda _status, _reason: answer(HOST_UNREACHABLE),
            )
            return
    try:
        upstream = await service.connect(decision, port)
    except Refused:
        writer.write(reply(HOST_UNREACHABLE))
        await writer.drain()
        return
    writer.write(reply(SUCCEEDED))
    await service.pipe((reader, writer), upstream)


async def refuse(
    service: EgressService,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    status: int,
    reason: str,
) -> None:
    """A connection past a bound: the request is read, then "general failure" (0x01; SOCKS
    has no text, the reason is in the log). 0x02 stays the policy's refusal."""
    try:
        await asyncio.wait_for(negotiate(reader, writer), service.limits.head_timeout_s)
    except ProtocolError as exc:
        if exc.reply is None:
            return
    writer.write(reply(GENERAL_FAILURE))
    await writer.drain()


async def negotiate(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> tuple[str, int]:
    """Method selection, then the request: returns the destination (host, port)."""
    version, count = await reader.readexactly(2)
    if version != VERSION:
        raise ProtocolError(f"not SOCKS5 (version {version})")
    methods = await reader.readexactly(count)
    if NO_AUTH not in methods:
        writer.write(bytes((VERSION, NO_ACCEPTABLE)))
        raise ProtocolError("the client offers no method we accept")
    writer.write(bytes((VERSION, NO_AUTH)))
    await writer.drain()
    version, command, _reserved, atyp = await reader.readexactly(4)
    if version != VERSION:
        raise ProtocolError(f"bad request version {version}", GENERAL_FAILURE)
    if command != CMD_CONNECT:
        raise ProtocolError(f"command {command} is not supported", CMD_NOT_SUPPORTED)
    host = await _address(reader, atyp)
    (port,) = struct.unpack("!H", await reader.readexactly(2))
    if port == 0:
        raise ProtocolError("port 0", GENERAL_FAILURE)
    return host, port


async def _address(reader: asyncio.StreamReader, atyp: int) -> str:
    """The destination; an IP address, of either type or written as a name, normalised
    (`::ffff:127.0.0.1` is 127.0.0.1)."""
    if atyp == ATYP_IPV4:
        return str(ipaddress.IPv4Address(await reader.readexactly(4)))
    if atyp == ATYP_IPV6:
        return canonical_host(str(ipaddress.IPv6Address(await reader.readexactly(16))))
    if atyp == ATYP_DOMAIN:
        (length,) = await reader.readexactly(1)
        raw = await reader.readexactly(length)
        try:
            name = raw.decode("ascii")
        except UnicodeDecodeError:
            raise ProtocolError("host name is not ASCII", GENERAL_FAILURE) from None
        if not name or not name.isprintable() or " " in name:
            raise ProtocolError("invalid host name", GENERAL_FAILURE)
        return canonical_host(name)
    raise ProtocolError(f"address type {atyp} is not supported", ATYP_NOT_SUPPORTED)


def reply(code: int) -> bytes:
    """A reply with an unspecified bound address (0.0.0.0:0): the cell cannot use it anyway."""
    return bytes((VERSION, code, 0, ATYP_IPV4, 0, 0, 0, 0, 0, 0))
