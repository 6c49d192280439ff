"""The router end to end through real HTTP against a real `sandcell serve` and real cells."""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from support.cells import kill_daemon
from support.server import SMALL_TEMPLATE, RunningServer, start_server

CONFIG = "[server]\nreap_interval_s = 1\n" + SMALL_TEMPLATE.format(warm_pool=1)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    srv = start_server(tmp_path_factory.mktemp("router") / "data", config_text=CONFIG)
    yield srv
    srv.stop()
    assert not list((srv.data_dir / "cells").iterdir()), "cells left after shutdown"


@pytest.fixture(scope="module")
def alice(server: RunningServer) -> str:
    return server.create_key("alice")


@pytest.fixture(scope="module")
def bob(server: RunningServer) -> str:
    return server.create_key("bob")


def _create(c: httpx.Client, **body) -> dict:
    r = c.post("/v1/sandboxes", json=body)
    assert r.status_code == 201, r.text
    return r.json()


def _code(r: httpx.Response) -> str:
    return r.json()["error"]["code"]


def test_lifecycle_exec_stream_and_files(server, alice):
    with server.client(alice) as c:
        sbx = _create(c, metadata={"purpose": "test"})
        assert sbx["state"] == "running" and sbx["metadata"] == {"purpose": "test"}
        base = f"/v1/sandboxes/{sbx['id']}"
        r = c.post(f"{base}/exec", json={"command": "echo $((6*7))"})
        assert r.json()["stdout"] == "42\n"
        assert r.headers["x-request-id"]
        assert len(r.headers.get_list("date")) == 1 and len(r.headers.get_list("server")) == 1
        started, arrivals = time.monotonic(), []
        with c.stream(
            "POST",
            f"{base}/exec",
            headers={"accept": "application/x-ndjson"},
            json={"command": "echo first; sleep 1; echo second"},
        ) as resp:
            for line in resp.iter_lines():
                if line:
                    arrivals.append((time.monotonic() - started, json.loads(line)))
        assert [e["type"] for _, e in arrivals] == ["stdout", "stdout", "exit"]
        assert arrivals[0][0] < 0.8, "output did not stream through the router"
        assert c.get(base).json()["id"] == sbx["id"]
        assert [s["id"] for s in c.get("/v1/sandboxes").json()["sandboxes"]] == [sbx["id"]]
        assert c.delete(base).status_code == 204
        assert c.get(base).status_code == 404
        gone = c.delete(base)  # nothing left to delete, and the answer says so
        assert gone.status_code == 404 and _code(gone) == "SANDBOX_NOT_FOUND"


@pytest.mark.slow
def test_fifty_megabyte_upload_and_download_stream(server, alice, tmp_path):
    size = 50 * 1024 * 1024
    chunk = os.urandom(1024 * 1024)
    digest = hashlib.sha256(chunk * 50).hexdigest()

    def body() -> Iterator[bytes]:
        for _ in range(50):
            yield chunk

    with server.client(alice, timeout=120) as c:
        sbx = _create(c)
        base = f"/v1/sandboxes/{sbx['id']}"
        r = c.put(f"{base}/files", params={"path": "big.bin"}, content=body())
        assert r.status_code == 200 and r.json()["size"] == size, r.text
        h = hashlib.sha256()
        with c.stream("GET", f"{base}/files", params={"path": "big.bin"}) as resp:
            assert resp.status_code == 200
            for part in resp.iter_bytes():
                h.update(part)
        assert h.hexdigest() == digest
        inside = c.post(f"{base}/exec", json={"command": "sha256sum big.bin"}).json()
        assert inside["stdout"].split()[0] == digest
        c.delete(base)


def test_other_principal_sees_nothing(server, alice, bob):
    admin = server.create_key("root-admin", admin=True)
    with server.client(alice) as a, server.client(bob) as b, server.client(admin) as adm:
        sbx = _create(a)
        base = f"/v1/sandboxes/{sbx['id']}"
        for r in (
            b.get(base),
            b.post(f"{base}/exec", json={"command": "id"}),
            b.get(f"{base}/files", params={"path": "x"}),
            b.post(f"{base}/keepalive", json={}),
        ):
            assert r.status_code == 404 and _code(r) == "SANDBOX_NOT_FOUND"
        assert b.get("/v1/sandboxes").json()["sandboxes"] == []
        not_bobs = b.delete(base)
        assert not_bobs.status_code == 404 and _code(not_bobs) == "SANDBOX_NOT_FOUND"
        never = b.delete("/v1/sandboxes/sbx-0000000000000000")  # the answer reveals nothing:
        assert never.json() == json.loads(not_bobs.text.replace(sbx["id"], "sbx-0000000000000000"))
        assert a.post(f"{base}/exec", json={"command": "true"}).status_code == 200  # untouched
        assert sbx["id"] in [s["id"] for s in adm.get("/v1/sandboxes").json()["sandboxes"]]
        assert a.delete(base).status_code == 204


def test_revoked_key_is_refused(server):
    key = server.create_key("short-lived")
    with server.client(key) as c:
        assert c.get("/v1/sandboxes").status_code == 200
        server.revoke_key("short-lived")
        r = c.get("/v1/sandboxes")
        assert r.status_code == 401 and _code(r) == "UNAUTHENTICATED"


def test_api_key_brute_force_is_rate_limited(server, alice):
    """Failures are counted per client address: this test guesses from 127.0.0.2."""

    def client(key: str) -> httpx.Client:
        transport = httpx.HTTPTransport(local_address="127.0.0.2")
        return httpx.Client(
            base_url=server.url, transport=transport, headers={"authorization": f"Bearer {key}"}
        )

    with client("sc_wrong") as c:
        statuses = [c.get("/v1/sandboxes").status_code for _ in range(15)]
        assert statuses[0] == 401 and statuses[-1] == 429
        r = c.get("/v1/sandboxes")
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
    with client(alice) as c:  # a valid key from the same address is still served
        assert c.get("/v1/sandboxes").status_code == 200
    with server.client(alice) as c:  # other addresses are unaffected
        assert c.get("/v1/sandboxes").status_code == 200


def test_keepalive_and_templates(server, alice):
    with server.client(alice) as c:
        sbx = _create(c, idle_timeout_s=30)
        r = c.post(f"/v1/sandboxes/{sbx['id']}/keepalive", json={"idle_timeout_s": 120})
        assert r.status_code == 200 and r.json()["idle_timeout_s"] in (30, 120)
        templates = c.get("/v1/templates").json()["templates"]
        assert templates[0]["name"] == "default" and templates[0]["memory_mb"] == 256
        c.delete(f"/v1/sandboxes/{sbx['id']}")


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (b"{", 400),
        (b"[]", 400),
        (b'{"template": "nope"}', 400),
        (b'{"bogus": 1}', 400),
        (b'{"idle_timeout_s": -1}', 400),
        (b'{"env": {"A": 1}}', 400),
        (b'{"max_lifetime_s": 86400}', 400),  # longer than the template allows
    ],
)
def test_bad_create_bodies(server, alice, body, status):
    with server.client(alice) as c:
        r = c.post("/v1/sandboxes", content=body, headers={"content-type": "application/json"})
        assert r.status_code == status and _code(r) == "BAD_REQUEST", r.text


def test_daemon_killed_gives_502_then_reaped(server, alice):
    with server.client(alice) as c:
        sbx = _create(c)
        base = f"/v1/sandboxes/{sbx['id']}"
        marker = f"marker-{sbx['id']}"
        c.post(f"{base}/exec", json={"command": f"touch {marker}"})
        cell_id = next(
            p.parent.parent.name for p in (server.data_dir / "cells").glob(f"*/workspace/{marker}")
        )
        kill_daemon("sandcell", cell_id)
        started = time.monotonic()
        r = c.post(f"{base}/exec", json={"command": "true"})
        assert r.status_code == 502 and _code(r) == "SANDBOX_UNREACHABLE"
        assert time.monotonic() - started < 3
        deadline = time.monotonic() + 15
        while c.get(base).status_code != 404:
            assert time.monotonic() < deadline, "the dead sandbox was not reaped"
            time.sleep(0.2)
        assert not (server.data_dir / "cells" / cell_id).exists()


def test_metrics_and_health(server, alice):
    with server.client() as c:
        assert c.get("/healthz").json()["status"] == "ok"
        assert c.get("/readyz").status_code == 200
        text = c.get("/metrics").text
        assert "sandcell_requests_total" in text and "sandcell_pool_ready" in text
        doc = c.get("/openapi.json").json()
        assert "/v1/sandboxes" in doc["paths"]
        r = c.get("/no/such/route")
        assert r.status_code == 404 and _code(r) == "NOT_FOUND"


def _cells(data_dir: Path) -> set[str]:
    return {p.name for p in (data_dir / "cells").iterdir()}


@pytest.mark.slow
def test_sigkill_and_restart_loses_nothing_and_leaks_nothing(tmp_path):
    data = tmp_path / "data"
    first = start_server(data, config_text=SMALL_TEMPLATE.format(warm_pool=1))
    key = first.create_key("alice")
    with first.client(key) as c:
        live = _create(c)
        dead = _create(c)
        c.put(f"/v1/sandboxes/{live['id']}/files", params={"path": "keep.txt"}, content=b"kept")
        marker = f"m-{dead['id']}"
        c.post(f"/v1/sandboxes/{dead['id']}/exec", json={"command": f"touch {marker}"})
    dead_cell = next(p.parent.parent.name for p in (data / "cells").glob(f"*/workspace/{marker}"))
    first.stop(sig=9)
    kill_daemon("sandcell", dead_cell)
    second = start_server(
        data, config_text=SMALL_TEMPLATE.format(warm_pool=1), port=int(first.url.rsplit(":", 1)[1])
    )
    try:
        with second.client(key) as c:
            ids = [s["id"] for s in c.get("/v1/sandboxes").json()["sandboxes"]]
            assert ids == [live["id"]]
            r = c.get(f"/v1/sandboxes/{live['id']}/files", params={"path": "keep.txt"})
            assert r.content == b"kept"  # the session key still decrypts
            assert (
                c.post(f"/v1/sandboxes/{live['id']}/exec", json={"command": "echo ok"}).json()[
                    "stdout"
                ]
                == "ok\n"
            )
        assert dead_cell not in _cells(data)
        assert len(_cells(data)) == 2  # the live sandbox and the new pool cell: no orphan
        with second.client(key) as c:
            assert c.delete(f"/v1/sandboxes/{live['id']}").status_code == 204
    finally:
        second.stop()
    assert _cells(data) == set()


@pytest.mark.slow
def test_the_sandbox_limit_holds_under_concurrent_creates(tmp_path):
    """Nine creates at once against a limit of three: three sandboxes, six 429s (counting
    first and creating after would let all nine through)."""
    config = "[server]\nmax_sandboxes_per_key = 3\n" + SMALL_TEMPLATE.format(warm_pool=0)
    server = start_server(tmp_path / "data", config_text=config)
    try:
        key = server.create_key("alice")
        barrier = threading.Barrier(9, timeout=10)

        def create(_: int) -> httpx.Response:
            with server.client(key) as c:
                c.get("/healthz")  # connected before the barrier: the creates really race
                barrier.wait()
                return c.post("/v1/sandboxes", json={})

        with ThreadPoolExecutor(9) as pool:
            replies = list(pool.map(create, range(9)))
        assert sorted(r.status_code for r in replies) == [201] * 3 + [429] * 6
        assert {_code(r) for r in replies if r.status_code == 429} == {"RATE_LIMITED"}
        with server.client(key) as c:
            assert len(c.get("/v1/sandboxes").json()["sandboxes"]) == 3
            for r in replies:
                if r.status_code == 201:
                    assert c.delete(f"/v1/sandboxes/{r.json()['id']}").status_code == 204
            again = _create(c)  # the slots came back
            c.delete(f"/v1/sandboxes/{again['id']}")
    finally:
        server.stop()
    assert _cells(server.data_dir) == set()


def test_a_create_whose_store_dies_leaves_no_cell(tmp_path, own_redis):
    """Redis dies while the cell starts: the answer is a retryable 503 and the cell is
    destroyed although the store cannot be told anything."""
    redis_proc, url = own_redis
    config = f'[server]\nstore = "{url}"\n' + SMALL_TEMPLATE.format(warm_pool=0)
    server = start_server(tmp_path / "data", config_text=config)
    try:
        key = server.create_key("alice")
        with server.client(key) as c, ThreadPoolExecutor(1) as pool:
            reply = pool.submit(c.post, "/v1/sandboxes", json={})
            deadline = time.monotonic() + 20
            while not _cells(server.data_dir):  # the slot is reserved, the cell is starting
                assert time.monotonic() < deadline, reply.result().text
                time.sleep(0.005)
            redis_proc.kill()
            r = reply.result()
        assert r.status_code == 503 and _code(r) == "OVERLOADED", r.text
        assert _cells(server.data_dir) == set()
    finally:
        server.stop()
