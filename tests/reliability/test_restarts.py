"""The control plane dies under traffic: `sandcell serve` SIGKILLed, Redis restarted."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import httpx
import pytest

from reliability.harness import (
    OwnRedis,
    assert_error_shape,
    cell_of,
    cells_of,
    config,
    servers,
    store_key_env,
    wait_for,
)

SEED_SANDBOXES = 6
TRAFFIC_THREADS = 6


@dataclass
class Ledger:
    """What the clients were told, so that nothing acknowledged can go missing unnoticed."""

    created: set[str] = field(default_factory=set)
    deleted: set[str] = field(default_factory=set)
    creating: int = 0  # creates in flight (their answer never came)
    deleting: set[str] = field(default_factory=set)
    ok: int = 0
    failures: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_serve_sigkilled_mid_traffic_then_restarted(fleet, figures):
    server = fleet.start("data", config_text=config(warm_pool=1, reap_interval_s=1))
    key = server.create_key("alice")
    ledger = Ledger()
    with server.client(key) as c:
        for _ in range(SEED_SANDBOXES):
            r = c.post("/v1/sandboxes", json={})
            assert r.status_code == 201, r.text
            sid = r.json()["id"]
            ledger.created.add(sid)
            put = c.put(f"/v1/sandboxes/{sid}/files", params={"path": "keep.txt"}, content=sid)
            assert put.status_code == 200
    seeds = sorted(ledger.created)
    stop = threading.Event()

    def traffic(n: int) -> None:
        """Execs on a seed sandbox; every third thread also creates and deletes sandboxes."""
        with server.client(key, timeout=10) as own:
            i = 0
            while not stop.is_set():
                i += 1
                try:
                    if n % 3 == 0 and i % 4 == 0:
                        with ledger.lock:
                            ledger.creating += 1
                        r = own.post("/v1/sandboxes", json={})
                        with ledger.lock:
                            ledger.creating -= 1
                            if r.status_code == 201:
                                ledger.created.add(r.json()["id"])
                        if r.status_code == 201 and i % 8 == 0:
                            sid = r.json()["id"]
                            with ledger.lock:
                                ledger.deleting.add(sid)
                            if own.delete(f"/v1/sandboxes/{sid}").status_code == 204:
                                with ledger.lock:
                                    ledger.deleted.add(sid)
                                    ledger.deleting.discard(sid)
                        continue
                    sid = seeds[n % len(seeds)]
                    r = own.post(f"/v1/sandboxes/{sid}/exec", json={"command": f"echo {i}"})
                    if r.status_code == 200 and r.json()["stdout"] == f"{i}\n":
                        with ledger.lock:
                            ledger.ok += 1
                    else:
                        ledger.failures.append(f"{r.status_code} {r.text[:100]}")
                except httpx.HTTPError:
                    if not stop.is_set():
                        time.sleep(0.05)  # the server is gone: keep knocking until told to stop

    threads = [threading.Thread(target=traffic, args=(n,)) for n in range(TRAFFIC_THREADS)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: ledger.ok >= 150, 30, "traffic to flow")
        before_kill = ledger.ok
        server.proc.send_signal(signal.SIGKILL)
        server.proc.wait(10)
        killed = time.monotonic()
        time.sleep(0.5)  # clients hit a dead port for a while
        in_flight_creates = ledger.creating
        restarted = fleet.restart(server)
        restart_s = time.monotonic() - killed
    finally:
        stop.set()
        for t in threads:
            t.join(20)
    assert not any(t.is_alive() for t in threads)
    assert ledger.failures == [], ledger.failures[:5]

    with restarted.client(key) as c:
        listed = [s["id"] for s in c.get("/v1/sandboxes").json()["sandboxes"]]
        assert len(listed) == len(set(listed)), "a sandbox is listed twice"
        must_exist = ledger.created - ledger.deleted - ledger.deleting
        missing = must_exist - set(listed)
        assert not missing, f"acknowledged sandboxes lost: {missing}"
        extra = set(listed) - ledger.created
        assert len(extra) <= in_flight_creates, f"sandboxes nobody asked for: {extra}"
        assert not set(listed) & ledger.deleted, "a deleted sandbox came back"
        for sid in listed:
            r = c.post(f"/v1/sandboxes/{sid}/exec", json={"command": "echo back"})
            assert r.status_code == 200 and r.json()["stdout"] == "back\n", r.text
        for sid in seeds:  # the session keys still decrypt: the files come back through them
            r = c.get(f"/v1/sandboxes/{sid}/files", params={"path": "keep.txt"})
            assert r.status_code == 200 and r.text == sid
        # One cell per sandbox, plus the refilled pool cell: no orphan, no duplicate.
        owned = {cell_of(restarted, c, sid) for sid in listed}
        assert len(owned) == len(listed)
        wait_for(lambda: len(cells_of(restarted.data_dir)) == len(listed) + 1, 20, "the pool")
        assert owned < cells_of(restarted.data_dir)
        for sid in listed:
            assert c.delete(f"/v1/sandboxes/{sid}").status_code == 204
    figures["fault: serve SIGKILL mid-traffic"] = {
        "execs_ok_before_kill": before_kill,
        "sandboxes_acknowledged": len(must_exist),
        "sandboxes_after_restart": len(listed),
        "lost": 0,
        "duplicated": 0,
        "restart_to_ready_s": round(restart_s, 2),
    }


# -- Redis restarted under a router --------------------------------------------------------------


@dataclass
class Outage:
    during: list[tuple[str, str, float]]  # (request, status or exception, seconds to answer)
    readyz_during: int
    recovered_after_s: float
    after: dict[str, object]


@pytest.fixture(scope="module")
def redis_outage(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Outage]:
    """A router on a Redis of its own; Redis goes down (data saved) and comes back."""
    root = tmp_path_factory.mktemp("redis-outage")
    own = OwnRedis(root)
    own.start()
    try:
        with servers(root) as fleet:
            server = fleet.start(
                "data",
                config_text=config(store=own.url, reap_interval_s=1),
                extra_env=store_key_env(),
            )
            key = server.create_key("alice")
            with server.client(key, timeout=20) as c, server.client(timeout=20) as anonymous:
                yield _outage(c, anonymous, own)
    finally:
        own.kill()


def _attempt(call: Callable[[], httpx.Response]) -> tuple[str, float]:
    """What the caller saw: a status with the error shape checked, or the transport error."""
    started = time.perf_counter()
    try:
        r = call()
    except httpx.HTTPError as exc:
        return type(exc).__name__, time.perf_counter() - started
    took = time.perf_counter() - started
    if r.status_code >= 400:
        assert_error_shape(r)
    return str(r.status_code), took


def _outage(c: httpx.Client, anonymous: httpx.Client, own: OwnRedis) -> Outage:
    r = c.post("/v1/sandboxes", json={})
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    base = f"/v1/sandboxes/{sid}"
    assert c.put(f"{base}/files", params={"path": "k.txt"}, content=b"kept").status_code == 200

    own.shutdown_saving()
    attempts = {
        "list": lambda: c.get("/v1/sandboxes"),
        "get": lambda: c.get(base),
        "exec": lambda: c.post(f"{base}/exec", json={"command": "true"}),
        "create": lambda: c.post("/v1/sandboxes", json={}),
        "keepalive": lambda: c.post(f"{base}/keepalive", json={}),
        "delete": lambda: c.delete(base),
    }
    during = []
    for _ in range(2):
        for name, call in attempts.items():
            during.append((name, *_attempt(call)))
    readyz = anonymous.get("/readyz").status_code
    time.sleep(1.5)  # a reaper pass or two against the dead store

    own.start()  # same port and dir: it loads what it saved
    back = time.monotonic()

    def listing() -> bool:
        with contextlib.suppress(httpx.HTTPError):
            return c.get("/v1/sandboxes").status_code == 200
        return False

    wait_for(listing, 15, "the router to recover")
    recovered = time.monotonic() - back
    after = {
        "sid": sid,
        "listed": [s["id"] for s in c.get("/v1/sandboxes").json()["sandboxes"]],
        "exec": c.post(f"{base}/exec", json={"command": "echo hi"}).json().get("stdout"),
        "file": c.get(f"{base}/files", params={"path": "k.txt"}).content,
        "readyz": anonymous.get("/readyz").status_code,
        "create": c.post("/v1/sandboxes", json={}).status_code,
    }
    for s in c.get("/v1/sandboxes").json()["sandboxes"]:
        c.delete(f"/v1/sandboxes/{s['id']}")
    return Outage(during, readyz, recovered, after)


@pytest.mark.slow
def test_redis_restart_fails_clearly_then_recovers(redis_outage, figures):
    o = redis_outage
    slowest = max(t for _, _, t in o.during)
    assert slowest < 5, f"a request waited {slowest:.1f} s on the dead store"
    succeeded = [(name, seen) for name, seen, _ in o.during if seen.startswith("2")]
    assert succeeded == [], f"requests succeeded without their store: {succeeded}"
    assert o.readyz_during == 503
    assert o.after["listed"] == [o.after["sid"]], "the sandbox did not survive the outage"
    assert o.after["exec"] == "hi\n"
    assert o.after["file"] == b"kept"  # its session key still decrypts
    assert o.after["readyz"] == 200 and o.after["create"] == 201
    figures["fault: redis restart"] = {
        "requests_during_outage": len(o.during),
        "seen_during_outage": sorted({s for _, s, _ in o.during}),
        "slowest_answer_s": round(slowest, 3),
        "recovered_after_s": round(o.recovered_after_s, 2),
        "sandboxes_lost": 0,
    }


@pytest.mark.slow
def test_requests_during_a_redis_outage_are_503_not_500(redis_outage):
    seen = [(name, status) for name, status, _ in redis_outage.during]
    assert {status for _, status in seen} == {"503"}, seen
