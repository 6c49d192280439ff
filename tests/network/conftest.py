"""An egress service in this test's event loop, with listeners on the host's loopback, and
small real servers to reach through it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from sandcell.network.egress import EgressLimits, EgressService, system_resolver
from sandcell.network.policy import NONE, NetworkPolicy, parse_policy
from support.sockets import listening


@dataclass
class Proxies:
    service: EgressService
    policies: dict[str, NetworkPolicy]
    names: dict[str, list[str]] = field(default_factory=dict)
    http_port: int = 0
    socks_port: int = 0

    def set(self, raw: dict, sandbox_id: str = "sbx-test") -> None:
        self.policies[sandbox_id] = parse_policy(raw)


@pytest.fixture
async def proxies() -> AsyncIterator[Proxies]:
    policies: dict[str, NetworkPolicy] = {}
    names: dict[str, list[str]] = {}

    async def policy_for(sandbox_id: str) -> NetworkPolicy:
        return policies.get(sandbox_id, NONE)

    async def resolver(host: str, port: int) -> list[str]:
        """Names the test planted first (a rebinding resolver), then the system's."""
        return names[host] if host in names else await system_resolver(host, port)

    service = EgressService(
        policy_for, resolver=resolver, limits=EgressLimits(max_connections=4, idle_timeout_s=5)
    )
    http, socks = listening(), listening()
    state = Proxies(service, policies, names, http.getsockname()[1], socks.getsockname()[1])
    await service.serve("sbx-test", http, socks)
    yield state
    await service.close()


@pytest.fixture
async def origin() -> AsyncIterator[int]:
    """A tiny HTTP origin: answers every request with its method and target, then closes."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        first = head.split(b"\r\n")[0]
        body = b"origin saw " + first
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s"
            % (len(body), body)
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1]
    server.close()


@pytest.fixture
async def echo() -> AsyncIterator[int]:
    """A TCP echo server."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1]
    server.close()
