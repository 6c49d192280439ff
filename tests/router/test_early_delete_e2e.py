"""DELETE answers before the cell's teardown, through a real `sandcell serve` with real cells:
the owner's view and limits follow the answer at once, and nothing is left behind."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from support.server import SMALL_TEMPLATE, RunningServer, start_server

LIMIT = 3
FLOOD = 8


def _config(limit: int) -> str:
    return f"[server]\nmax_sandboxes_per_key = {limit}\n" + SMALL_TEMPLATE.format(warm_pool=1)


def _cells(server: RunningServer) -> list[str]:
    return sorted(p.name for p in (server.data_dir / "cells").iterdir())


def _wait_cells(server: RunningServer, count: int, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while len(_cells(server)) != count:
        assert time.monotonic() < deadline, f"cells: {_cells(server)}, expected {count}"
        time.sleep(0.05)


def _create(c: httpx.Client) -> str:
    r = c.post("/v1/sandboxes", json={})
    assert r.status_code == 201, r.text
    return r.json()["id"]


@pytest.fixture
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[int], RunningServer]]:
    """Starts a server with a per-key limit; each one is stopped and checked at the end (in
    a short directory: a daemon's socket path must fit AF_UNIX's 108 bytes)."""
    started: list[RunningServer] = []

    def start(limit: int) -> RunningServer:
        data_dir = tmp_path_factory.mktemp("dl") / "data"
        started.append(start_server(data_dir, config_text=_config(limit)))
        return started[-1]

    yield start
    for srv in started:
        srv.stop()
        assert _cells(srv) == [], "cells left after shutdown"


@pytest.mark.slow
def test_delete_then_create_at_the_limit(serve):
    """A deleted sandbox's slot is free the moment DELETE answers, and the limit still holds:
    a client cycling deletes and creates never holds more than its limit."""
    server = serve(LIMIT)
    key = server.create_key("alice")
    with server.client(key) as c:
        live = [_create(c) for _ in range(LIMIT)]
        for _ in range(4):
            gone = live.pop(0)
            assert c.delete(f"/v1/sandboxes/{gone}").status_code == 204
            live.append(_create(c))  # at once: its teardown may still be under way
            over = c.post("/v1/sandboxes", json={})
            assert over.status_code == 429 and over.json()["error"]["code"] == "RATE_LIMITED"
            assert c.get(f"/v1/sandboxes/{gone}").status_code == 404
        listed = {s["id"] for s in c.get("/v1/sandboxes").json()["sandboxes"]}
        assert listed == set(live)
        for sid in live:
            assert c.delete(f"/v1/sandboxes/{sid}").status_code == 204
    _wait_cells(server, 1)  # the warm pool's cell alone


@pytest.mark.slow
def test_delete_flood_then_second_deletes_are_404(serve):
    server = serve(FLOOD)
    admin = server.create_key("root", admin=True)
    with server.client(admin) as c:
        ids = [_create(c) for _ in range(FLOOD)]
    with ThreadPoolExecutor(len(ids)) as pool:

        def delete(sid: str) -> int:
            with server.client(admin) as own:
                return own.delete(f"/v1/sandboxes/{sid}").status_code

        assert list(pool.map(delete, ids)) == [204] * len(ids)
    with server.client(admin) as c:
        for sid in ids:
            r = c.delete(f"/v1/sandboxes/{sid}")
            assert r.status_code == 404 and r.json()["error"]["code"] == "SANDBOX_NOT_FOUND"
            assert c.post(f"/v1/sandboxes/{sid}/exec", json={"command": "true"}).status_code == 404
        assert c.get("/v1/sandboxes").json()["sandboxes"] == []
    _wait_cells(server, 1)


@pytest.mark.slow
def test_shutdown_right_after_deletes_leaves_nothing(serve):
    server = serve(LIMIT)
    key = server.create_key("alice")
    with server.client(key) as c:
        ids = [_create(c) for _ in range(LIMIT)]
        for sid in ids:
            assert c.delete(f"/v1/sandboxes/{sid}").status_code == 204
    server.proc.send_signal(signal.SIGTERM)  # while the teardowns are under way
    assert server.proc.wait(60) == 0
    assert _cells(server) == []
