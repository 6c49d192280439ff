"""The one health probe of a daemon: `GET /health` answers 200 within a short timeout."""

from __future__ import annotations

import errno
from typing import Any

import httpx

from sandcell.cellapi.client import async_transport, transport_for
from sandcell.errors import ErrorCode, SandcellError

HEALTH_PATH = "/health"
PROBE_TIMEOUT_S = 2.0
# The prober's own shortage, which says nothing about the daemon it could not reach.
LOCAL_ERRNOS = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}


class ProbeInconclusive(SandcellError):
    """This process ran out of descriptors or buffers: the daemon's health is unknown."""

    def __init__(self, cause: OSError) -> None:
        super().__init__(
            ErrorCode.OVERLOADED,
            f"the server is short of resources: {cause.strerror}",
            headers={"Retry-After": "1"},
        )


def local_shortage(exc: BaseException) -> OSError | None:
    """The EMFILE-like OSError somewhere in `exc`'s chain (httpx wraps it twice), if any."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in LOCAL_ERRNOS:
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


async def probe(endpoint: dict[str, Any], timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether the daemon answers; raises `ProbeInconclusive` when this process could not
    even ask (a reaper must not call a healthy cell dead for that)."""
    try:
        transport, base = async_transport(endpoint)
        async with httpx.AsyncClient(
            transport=transport, base_url=base, timeout=timeout_s
        ) as client:
            return (await client.get(HEALTH_PATH)).status_code == 200
    except (httpx.HTTPError, OSError) as exc:
        if (shortage := local_shortage(exc)) is not None:
            raise ProbeInconclusive(shortage) from exc
        if isinstance(exc, OSError):
            raise
        return False


def probe_sync(
    endpoint: dict[str, Any], timeout_s: float = PROBE_TIMEOUT_S, client: httpx.Client | None = None
) -> bool:
    """Blocking variant; pass `client` to reuse one connection pool across a polling loop."""
    if client is not None:
        return _answers(client)
    transport, base = transport_for(endpoint)
    with httpx.Client(transport=transport, base_url=base, timeout=timeout_s) as fresh:
        return _answers(fresh)


def _answers(client: httpx.Client) -> bool:
    try:
        return client.get(HEALTH_PATH).status_code == 200
    except httpx.HTTPError:
        return False
