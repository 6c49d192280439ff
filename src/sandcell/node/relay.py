"""The relay (SPEC §18): a router's `CONNECT /cells/<sandbox_id> HTTP/1.1` becomes a pipe of
raw bytes to that cell's daemon socket.

The node checks only that the sandbox is one of its own running cells; what then flows is the
router's ordinary signed request, which the daemon checks as always. So the relay holds no
session key and can neither forge a call nor let a router without the key reach a cell. Bytes
read ahead of the tunnel's opening (a router that did not wait for the 200) go to the daemon
first, in order.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Any

from sandcell.errors import ErrorCode, ServiceError
from sandcell.manager.backend import Backend
from sandcell.store import Store
from sandcell.store.records import PAUSED_STATES, SandboxRecord

from .wire import TUNNEL_OPEN, bad

_TARGET = re.compile(r"/cells/([A-Za-z0-9_-]{1,64})")


def sandbox_of(target: str) -> str:
    """The sandbox a CONNECT's target names; a 400 for any other target."""
    matched = _TARGET.fullmatch(target)
    if matched is None:
        raise bad("CONNECT takes /cells/<sandbox_id>")
    return matched[1]


async def own_record(store: Store, backend: Backend, sandbox_id: str) -> SandboxRecord:
    """The record of a sandbox whose cell this node runs; 404 for any other."""
    record = await store.get_sandbox(sandbox_id)
    if record is None or record.state == "deleted" or not backend.owns(record.cell):
        raise ServiceError(
            ErrorCode.SANDBOX_NOT_FOUND,
            f"sandbox {sandbox_id} is not a cell of this node",
            {"sandbox_id": sandbox_id},
        )
    return record


async def socket_of(store: Store, backend: Backend, sandbox_id: str) -> str:
    """The daemon socket of a running sandbox whose cell this node runs; refused as the spec's
    errors otherwise (404 not one of ours, 409 paused, 502 not running)."""
    record = await own_record(store, backend, sandbox_id)
    if record.state in PAUSED_STATES:
        raise ServiceError(
            ErrorCode.SANDBOX_PAUSED, f"sandbox {sandbox_id} is paused", {"sandbox_id": sandbox_id}
        )
    uds = record.endpoint.get("uds")
    if record.state != "running" or not isinstance(uds, str):
        raise ServiceError(
            ErrorCode.SANDBOX_UNREACHABLE,
            f"sandbox {sandbox_id} is {record.state}, not running",
            {"sandbox_id": sandbox_id},
        )
    return uds


async def splice(transport: Any, leftover: Callable[[], bytes], uds: str, sandbox_id: str) -> None:
    """Opens the tunnel from the router's `transport` (reading paused) to the daemon at
    `uds`, what `leftover` gives (bytes the router sent past its CONNECT, taken once the
    transport is the tunnel's) first, and pipes both ways
    until either side ends. Transport to transport, with no copy through a stream and no
    task switch per chunk: the relay is on every request's path."""
    loop = asyncio.get_running_loop()
    try:
        daemon_transport, daemon = await loop.create_unix_connection(lambda: _Pipe(transport), uds)
    except OSError as exc:
        raise ServiceError(
            ErrorCode.SANDBOX_UNREACHABLE,
            f"sandbox {sandbox_id}'s daemon does not answer",
            {"sandbox_id": sandbox_id},
        ) from exc
    router = _Pipe(daemon_transport)
    transport.set_protocol(router)
    transport.write(TUNNEL_OPEN)
    if early := leftover():
        daemon_transport.write(early)
    transport.resume_reading()
    try:
        await asyncio.wait((router.done, daemon.done), return_when=asyncio.FIRST_COMPLETED)
    finally:
        daemon_transport.close()
        transport.close()


class _Pipe(asyncio.Protocol):
    """One direction's reader: what its transport receives goes to `peer`; when the peer's
    buffer fills, the other side's reading pauses (each side's `pause_writing` reaches the
    protocol of the transport that is full)."""

    def __init__(self, peer: Any) -> None:
        self.peer = peer
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        self.peer.write(data)

    def eof_received(self) -> bool:
        if self.peer.can_write_eof():  # the daemon's socket: half-closed, its answer still comes
            self.peer.write_eof()
            return True
        self.peer.close()  # TLS has no half-close: the tunnel ends here
        return False

    def pause_writing(self) -> None:
        self.peer.pause_reading()

    def resume_writing(self) -> None:
        self.peer.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.peer.close()
        if not self.done.done():
            self.done.set_result(None)
