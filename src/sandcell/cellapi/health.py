"""The one health probe of a daemon: `GET /health` answers 200 within a short timeout."""

from __future__ import annotations

from typing import Any

import httpx

from sandcell.cellapi.client import async_transport, transport_for

HEALTH_PATH = "/health"
PROBE_TIMEOUT_S = 2.0


async def probe(endpoint: dict[str, Any], timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    transport, base = async_transport(endpoint)
    try:
        async with httpx.AsyncClient(
            transport=transport, base_url=base, timeout=timeout_s
        ) as client:
            return (await client.get(HEALTH_PATH)).status_code == 200
    except httpx.HTTPError:
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
