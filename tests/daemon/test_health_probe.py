"""The reaper's health probe: only a real daemon's 200 counts as alive; anything else, in
time or not, is not."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from sandcell.cellapi import health
from support.daemons import RunningDaemon

pytestmark = pytest.mark.anyio

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _probe_fake(tmp_path: Path, handler: Handler, timeout_s: float = 2.0) -> bool:
    uds = tmp_path / "fake.sock"
    server = await asyncio.start_unix_server(handler, str(uds))
    async with server:
        return await health.probe({"uds": str(uds)}, timeout_s=timeout_s)


def _answer(data: bytes) -> Handler:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(data)
        await writer.drain()
        writer.close()

    return handler


async def test_a_live_daemon_is_healthy(daemon: RunningDaemon) -> None:
    assert await health.probe({"uds": str(daemon.uds)})


@pytest.mark.parametrize(
    "reply",
    [b"HTTP/1.1 500 Internal Server Error\r\n\r\n", b"junk 200\r\n", b"", b"HTTP/1.1 2000 x\r\n"],
)
async def test_anything_but_a_200_is_unhealthy(tmp_path: Path, reply: bytes) -> None:
    assert not await _probe_fake(tmp_path, _answer(reply))


async def test_a_silent_daemon_is_unhealthy_after_the_timeout(tmp_path: Path) -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(5)

    assert not await _probe_fake(tmp_path, silent, timeout_s=0.2)


async def test_no_socket_or_a_refusing_one_is_unhealthy(tmp_path: Path) -> None:
    assert not await health.probe({"uds": str(tmp_path / "absent.sock")})
    assert not await health.probe({"host": "127.0.0.1", "port": 9})  # discard: nobody listens
