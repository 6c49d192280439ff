"""The façade's file calls: the daemon's cell-wide file table, `/cell/files` (the workspace
and the cell's private /tmp, SPEC §14.2), sent through the router core like every call.

`Gateway.daemon` reaches `/v1/<rest>`, where files are the workspace's alone (§2.4); this
table is outside /v1, so users' /v1 calls never reach it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any
from urllib.parse import quote, urlencode

from sandcell.compat.e2b.gateway import Gateway
from sandcell.router.core import Answer, Call
from sandcell.store import SandboxRecord

CELL_FILES = "/cell/files"


def target(rest: str = "", query: Mapping[str, Any] | None = None) -> str:
    """The daemon's target for `rest` ("", "list", "stat", ...) of the table."""
    path = CELL_FILES + (f"/{quote(rest, safe='/')}" if rest else "")
    return path + (f"?{urlencode(query)}" if query else "")


async def send(
    gateway: Gateway,
    record: SandboxRecord,
    method: str,
    rest: str = "",
    *,
    query: Mapping[str, Any] | None = None,
    body: bytes = b"",
    stream: AsyncIterator[bytes] | None = None,
    length: int | None = None,
) -> Answer:
    """`method` on the table; a daemon's error raised as the same `ServiceError`. `stream`
    (an upload, `length` bytes or chunked) replaces `body`."""
    call = Call(method, target(rest, query), (), None if stream else body, stream, length)
    return await (await gateway.router.send(record, call)).raise_for_error()


async def json(gateway: Gateway, record: SandboxRecord, method: str, rest: str, **kw: Any) -> Any:
    """`send`'s JSON answer."""
    return await (await send(gateway, record, method, rest, **kw)).json()
