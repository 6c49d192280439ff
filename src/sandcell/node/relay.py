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
import contextlib
import re

from sandcell.errors import ErrorCode, ServiceError
from sandcell.manager.backend import Backend
from sandcell.store import Store
from sandcell.store.records import PAUSED_STATES, SandboxRecord

from .wire import TUNNEL_OPEN, bad

CHUNK = 64 * 1024
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


async def relay(
    client: tuple[asyncio.StreamReader, asyncio.StreamWriter], uds: str, sandbox_id: str
) -> None:
    """Opens the tunnel to `uds` and pipes both ways until either side ends."""
    try:
        daemon = await asyncio.open_unix_connection(uds)
    except OSError as exc:
        raise ServiceError(
            ErrorCode.SANDBOX_UNREACHABLE,
            f"sandbox {sandbox_id}'s daemon does not answer",
            {"sandbox_id": sandbox_id},
        ) from exc
    reader, writer = client
    writer.write(TUNNEL_OPEN)
    try:
        async with asyncio.TaskGroup() as pipes:
            pipes.create_task(_pipe(reader, daemon[1]))
            pipes.create_task(_pipe(daemon[0], writer))
    finally:
        daemon[1].close()
        with contextlib.suppress(OSError):
            await daemon[1].wait_closed()


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    """Copies until `source` ends, then half-closes `sink` (an HTTP/1.1 client never waits on
    that, so the other direction still ends the tunnel)."""
    try:
        while data := await source.read(CHUNK):
            sink.write(data)
            await sink.drain()
        if sink.can_write_eof():
            sink.write_eof()
        else:
            sink.close()  # TLS has no half-close: the tunnel ends here
    except (ConnectionError, OSError):
        sink.close()
