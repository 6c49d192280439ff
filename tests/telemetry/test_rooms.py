"""The spans of the rooms wired in with one call each: an egress connection (the proxies in
this loop, against an origin on loopback) and an image build (the builder's thread)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.trace import StatusCode

from sandcell.isolation.images.build import Builder
from sandcell.isolation.images.spec import ImageSpec
from sandcell.isolation.images.store import ImageStore
from sandcell.network.egress import EgressLimits, EgressService
from sandcell.network.policy import NONE, NetworkPolicy, parse_policy
from support.sockets import listening

from .recording import Recorded, recorded


@pytest.fixture
def tracing() -> Any:
    with recorded() as recording:
        yield recording


@pytest.fixture
async def origin() -> AsyncIterator[int]:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1]
    server.close()


@pytest.mark.anyio
async def test_each_egress_connection_is_a_span_with_its_decision(
    tracing: Recorded, origin: int
) -> None:
    policies: dict[str, NetworkPolicy] = {
        "sbx-out": parse_policy({"egress": "allowlist", "allow": [f"127.0.0.1:{origin}"]})
    }

    async def policy_for(sandbox_id: str) -> NetworkPolicy:
        return policies.get(sandbox_id, NONE)

    service = EgressService(policy_for, limits=EgressLimits(max_connections=4, idle_timeout_s=5))
    http, socks = listening(), listening()
    await service.serve("sbx-out", http, socks)
    try:
        proxy = f"http://127.0.0.1:{http.getsockname()[1]}"
        async with httpx.AsyncClient(proxy=proxy, timeout=5) as client:
            assert (await client.get(f"http://127.0.0.1:{origin}/a?secret=1")).status_code == 200
            assert (await client.get(f"http://127.0.0.1:{origin + 1}/b")).status_code == 403
    finally:
        await service.close()
    spans = tracing.named("egress.connection")
    assert sorted((s.attributes or {}).get("sandcell.decision") for s in spans) == [
        "allowed",
        "refused",
    ]
    for span in spans:
        assert span.parent is None  # a connection from the cell: a trace of its own
        assert span.attributes is not None
        assert span.attributes["sandcell.sandbox_id"] == "sbx-out"
        assert span.attributes["server.address"] == "127.0.0.1"
        assert span.attributes["server.port"] in (origin, origin + 1)
        assert "secret" not in str(dict(span.attributes))  # no path, no query


def test_an_image_build_is_a_span_failed_or_not(tracing: Recorded, tmp_path: Path) -> None:
    builder = Builder(ImageStore(tmp_path / "store"))
    spec = ImageSpec(base="oci-archive:nowhere.tar", context_dir=str(tmp_path))
    events = list(builder.start("tiny", spec).follow())
    assert events[-1]["event"] == "failed"
    (span,) = tracing.named("image.build")
    assert span.attributes == {"sandcell.template": "tiny"}
    assert span.parent is None and span.status.status_code is StatusCode.ERROR
