"""The router is the one shared door (SPEC §5): no single client may close it for others.

Each test performs the attack against a real `sandcell serve` (idle-connection floods, slow
bodies, unfinished 8 MiB bodies, key guessing from a shared address, clients leaving
mid-body, forged log lines, huge headers) with bounded loops, and checks that everyone else
is still served, that the attacker's connections go away in bounded time, and that the
router's memory and log stay small.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from reliability.harness import assert_error_shape, config, rss_bytes, servers, wait_for
from support.daemons import launch_daemon
from support.server import RunningServer

MIB = 1024 * 1024
CAP = 200
HEADER_TIMEOUT_S = 2
BODY_TIMEOUT_S = 2
INFLIGHT_PER_KEY = 8
BUDGET = 32 * MIB
BUDGET_PER_KEY = 16 * MIB
LIMITS = {
    "max_connections": CAP,
    "header_timeout_s": HEADER_TIMEOUT_S,
    "body_timeout_s": BODY_TIMEOUT_S,
    "max_inflight": 64,
    "max_inflight_per_key": INFLIGHT_PER_KEY,
    "body_budget_bytes": BUDGET,
    "body_budget_per_key_bytes": BUDGET_PER_KEY,
    "reap_interval_s": 0.5,
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with servers(tmp_path_factory.mktemp("door")) as fleet:
        yield fleet.start("data", config_text=config(**LIMITS))


@pytest.fixture(scope="module")
def keys(server: RunningServer) -> dict[str, str]:
    return {name: server.create_key(name) for name in ("alice", "bob", "carol")}


@pytest.fixture(scope="module")
def sid(server: RunningServer, keys: dict[str, str]) -> Iterator[str]:
    with server.client(keys["bob"]) as c:
        r = c.post("/v1/sandboxes", json={})
        assert r.status_code == 201, r.text
        yield r.json()["id"]
        c.delete(f"/v1/sandboxes/{r.json()['id']}")


@pytest.fixture(scope="module")
def own(server: RunningServer, keys: dict[str, str]) -> Iterator[dict[str, str]]:
    """A sandbox each for alice and carol: their proxied execs read 8 MiB bodies."""
    made = {}
    for name in ("alice", "carol"):
        with server.client(keys[name]) as c:
            r = c.post("/v1/sandboxes", json={})
            assert r.status_code == 201, r.text
            made[name] = r.json()["id"]
    yield made
    for name, sandbox in made.items():
        with server.client(keys[name]) as c:
            c.delete(f"/v1/sandboxes/{sandbox}")


def _address(server: RunningServer) -> tuple[str, int]:
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def _connect(server: RunningServer, source: str = "127.0.0.1") -> socket.socket:
    return socket.create_connection(_address(server), 5, (source, 0))


def _closed_by_server(s: socket.socket, within_s: float) -> bytes | None:
    """What the server sent before closing `s`, or None if it is still open after `within_s`."""
    s.settimeout(within_s)
    data = b""
    try:
        while chunk := s.recv(65536):
            data += chunk
    except TimeoutError:
        return None
    except ConnectionResetError:
        pass
    return data


def _status(answer: bytes) -> int | None:
    return int(answer.split()[1]) if answer.startswith(b"HTTP/1.") else None


def _exec_ok(c: httpx.Client, sid: str) -> float:
    started = time.monotonic()
    r = c.post(f"/v1/sandboxes/{sid}/exec", json={"command": "echo ok"})
    assert r.status_code == 200 and r.json()["stdout"] == "ok\n", r.text
    return time.monotonic() - started


def _open_descriptors(server: RunningServer) -> int:
    return len(os.listdir(f"/proc/{server.proc.pid}/fd"))


def _log_lines_since(server: RunningServer, offset: int) -> list[str]:
    with server.log.open("rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace").splitlines()


def _statuses(server: RunningServer) -> dict[str, float]:
    """sandcell_requests_total summed by status."""
    by_status: dict[str, float] = {}
    for line in httpx.get(f"{server.url}/metrics").text.splitlines():
        if line.startswith("sandcell_requests_total{"):
            status = line.split('status="', 1)[1].split('"', 1)[0]
            by_status[status] = by_status.get(status, 0) + float(line.rsplit(" ", 1)[1])
    return by_status


def _partial(path: str, key: str, length: int, sent: bytes) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    ).encode() + sent


# -- 6. idle connections -------------------------------------------------------------------------


@pytest.mark.slow
def test_idle_connection_flood_leaves_the_door_open(server, keys, sid, figures):
    """CAP + 100 idle connections (no key needed): /healthz still answers at once from a
    fresh client, the idle ones are closed after the header timeout, the reaper keeps the
    live sandbox, and the log stays small."""
    log_before = server.log.stat().st_size
    fds_before = _open_descriptors(server)
    idle = [_connect(server) for _ in range(CAP + 100)]
    half = [_connect(server) for _ in range(20)]
    for s in half:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # a head that never ends
    try:
        started = time.monotonic()
        assert httpx.get(f"{server.url}/healthz", timeout=5).status_code == 200
        healthz_s = time.monotonic() - started
        assert healthz_s < 1, healthz_s
        fds_during = _open_descriptors(server)
        assert fds_during <= fds_before + CAP + 5, (fds_before, fds_during)
        with server.client(keys["bob"]) as c:
            exec_s = _exec_ok(c, sid)
        time.sleep(2 * LIMITS["reap_interval_s"] + 0.5)  # reaper passes during the flood
        # Every idle connection is gone within the header timeout (evicted or timed out).
        closed = [_closed_by_server(s, HEADER_TIMEOUT_S + 2) for s in idle[-50:] + half]
        assert all(answer is not None for answer in closed)
    finally:
        for s in idle + half:
            s.close()
    with server.client(keys["bob"]) as c:
        r = c.get(f"/v1/sandboxes/{sid}")
        assert r.status_code == 200 and r.json()["state"] == "running", r.text
        _exec_ok(c, sid)
    log_growth = server.log.stat().st_size - log_before
    assert log_growth < 16_384, _log_lines_since(server, log_before)[-20:]
    figures["door: idle connection flood"] = {
        "idle_connections": CAP + 120,
        "connection_cap": CAP,
        "healthz_ms": round(healthz_s * 1000, 1),
        "exec_ms": round(exec_s * 1000, 1),
        "log_growth_bytes": log_growth,
        "router_descriptors_before_during": [fds_before, fds_during],
    }


@pytest.mark.slow
def test_a_router_out_of_descriptors_keeps_its_sandboxes_and_a_small_log(tmp_path_factory, figures):
    """Descriptors run out below the connection cap (the file limit lowered under a running
    router): accepts fail with EMFILE for seconds, yet the log gets one line of it, health
    probes are skipped rather than failed, and everything works once the flood ends."""
    with servers(tmp_path_factory.mktemp("fd")) as fleet:  # short: cell sockets live below
        server = fleet.start("emfile", config_text=config(reap_interval_s=0.5))
        key = server.create_key("alice")
        with server.client(key) as c:
            r = c.post("/v1/sandboxes", json={})
            assert r.status_code == 201, r.text
            sandbox = r.json()["id"]
        _, hard = resource.prlimit(server.proc.pid, resource.RLIMIT_NOFILE)
        resource.prlimit(server.proc.pid, resource.RLIMIT_NOFILE, (100, hard))
        log_before = server.log.stat().st_size
        flood = []
        try:
            for _ in range(300):
                with contextlib.suppress(OSError):  # the backlog fills: fine
                    flood.append(_connect(server))
            time.sleep(4)  # accepts failing, reaper passes probing
            log_growth = server.log.stat().st_size - log_before
        finally:
            for s in flood:
                s.close()
        lines = _log_lines_since(server, log_before)
        assert log_growth < 4096, lines
        assert any("health probes skipped" in line for line in lines), lines
        with server.client(key) as c:
            r = wait_for(lambda: _answered(c, f"/v1/sandboxes/{sandbox}"), 10, "the router")
            assert r.json()["state"] == "running"
            _exec_ok(c, sandbox)
            c.delete(f"/v1/sandboxes/{sandbox}")
    figures["door: out of descriptors"] = {"flood": len(flood), "log_growth_bytes": log_growth}


def _answered(c: httpx.Client, path: str) -> httpx.Response | None:
    try:
        r = c.get(path)
    except httpx.TransportError:
        return None
    return r if r.status_code == 200 else None


def test_a_silent_connection_is_dropped_after_the_header_timeout(server):
    s = _connect(server)
    started = time.monotonic()
    try:
        assert _closed_by_server(s, HEADER_TIMEOUT_S + 3) == b""
    finally:
        s.close()
    assert HEADER_TIMEOUT_S - 0.5 < time.monotonic() - started < HEADER_TIMEOUT_S + 2


@pytest.mark.slow
def test_a_dribbled_head_is_dropped_after_the_header_timeout(server):
    """Slowloris: a byte of head every half second never makes a request."""
    s = _connect(server)
    started = time.monotonic()
    try:
        for byte in b"GET /healthz HTTP/1.1\r\nHost: x\r\n":
            try:
                s.sendall(bytes([byte]))
            except OSError:
                break
            time.sleep(0.5)
            if time.monotonic() - started > HEADER_TIMEOUT_S + 3:
                break
        assert _closed_by_server(s, 1) == b""
    finally:
        s.close()
    assert time.monotonic() - started < HEADER_TIMEOUT_S + 3


# -- 7. slow bodies and fair shares --------------------------------------------------------------


@pytest.mark.slow
def test_one_key_with_stalled_bodies_cannot_take_every_slot(server, keys, sid, figures):
    """alice opens 64 requests that send their head and 10 bytes of a 1000-byte body: at most
    her share is admitted (the rest are 429 at once), those time out with a 408, and bob's
    execs are served all along."""
    path = f"/v1/sandboxes/{sid}/exec"  # bob's sandbox: alice never gets past the body
    flood = [_connect(server, "127.0.7.1") for _ in range(64)]
    started = time.monotonic()
    for s in flood:
        s.sendall(_partial("/v1/sandboxes", keys["alice"], 1000, b'{"template"'))
    try:
        with server.client(keys["bob"]) as c:
            bob_s = [_exec_ok(c, sid) for _ in range(5)]
        answers = [_closed_by_server(s, BODY_TIMEOUT_S + 5) for s in flood]
    finally:
        for s in flood:
            s.close()
    elapsed = time.monotonic() - started
    statuses = [_status(a) if a is not None else None for a in answers]
    assert None not in statuses, statuses  # every one answered and closed in bounded time
    assert statuses.count(408) <= INFLIGHT_PER_KEY, statuses
    assert set(statuses) <= {408, 429}, statuses
    assert max(bob_s) < 2, bob_s
    assert elapsed < BODY_TIMEOUT_S + 6
    limited = next(a for a in answers if a is not None and _status(a) == 429)
    assert b"retry-after: 1" in limited.lower()
    with server.client(keys["bob"]) as c:  # bob's own body, dribbled slowly but not stalled
        r = c.post(path, content=_slow_json(b'{"command": "echo slow-but-fine"}', 0.1))
        assert r.status_code == 200 and r.json()["stdout"] == "slow-but-fine\n", r.text
    figures["door: stalled bodies of one key"] = {
        "stalled_requests": len(flood),
        "admitted_then_408": statuses.count(408),
        "refused_429": statuses.count(429),
        "seconds_until_all_closed": round(elapsed, 2),
        "other_key_exec_max_ms": round(max(bob_s) * 1000, 1),
    }


def _slow_json(body: bytes, pause_s: float) -> Iterator[bytes]:
    for i in range(0, len(body), 8):
        time.sleep(pause_s)
        yield body[i : i + 8]


# -- 8. buffered bytes in flight -----------------------------------------------------------------


@pytest.mark.slow
def test_unfinished_big_bodies_cannot_grow_the_router(server, keys, sid, own, figures):
    """32 requests (two keys) each declare 8 MiB and send all but the last byte: the byte
    budget admits at most its total, the rest are refused before anything is buffered."""
    size = 8 * MIB
    pid = server.proc.pid
    before = rss_bytes(pid)
    flood: list[tuple[socket.socket, str]] = []
    payload = b"x" * (size - 1)

    def send(name: str) -> socket.socket:
        s = _connect(server, "127.0.8.1")
        with contextlib.suppress(OSError):  # refused early and closed: fine
            path = f"/v1/sandboxes/{own[name]}/exec"
            s.sendall(_partial(path, keys[name], size, payload))
        return s

    with ThreadPoolExecutor(16) as pool:
        names = ["alice", "carol"] * 16
        flood = list(zip(pool.map(send, names), names, strict=True))
    try:
        time.sleep(0.5)
        peak = rss_bytes(pid)
        with server.client(keys["bob"]) as c:
            _exec_ok(c, sid)
        answers = [_closed_by_server(s, BODY_TIMEOUT_S + 10) for s, _ in flood]
    finally:
        for s, _ in flood:
            s.close()
    statuses = [_status(a) if a else None for a in answers]
    growth = peak - before
    assert growth < BUDGET + 48 * MIB, (growth, statuses)
    assert statuses.count(429) + statuses.count(503) >= len(flood) - BUDGET // size, statuses
    for answer in answers:
        if answer and _status(answer) in (429, 503):
            assert b"retry-after" in answer.lower()
    figures["door: unfinished 8 MiB bodies"] = {
        "requests": len(flood),
        "declared_mib": len(flood) * 8,
        "budget_mib": BUDGET // MIB,
        "rss_before_mib": round(before / MIB, 1),
        "rss_peak_mib": round(peak / MIB, 1),
        "rss_growth_mib": round(growth / MIB, 1),
        "refused": statuses.count(429) + statuses.count(503),
    }


@pytest.mark.slow
def test_concurrent_big_execs_are_bounded_by_the_budget(server, keys, own, figures):
    """24 execs at once, each with a whole 8 MiB body: those past the key's share get a
    quick 429 with Retry-After, and the router's memory stays within the budget."""
    pid = server.proc.pid
    sandbox = own["alice"]
    stdin = "x" * (8 * MIB - 100)
    before = rss_bytes(pid)
    peak = before
    sampling = True

    def sample() -> None:
        nonlocal peak
        while sampling:
            peak = max(peak, rss_bytes(pid))
            time.sleep(0.02)

    def big_exec(_: int) -> int:
        with server.client(keys["alice"], timeout=60) as c:
            body = {"command": "wc -c", "stdin": stdin}
            r = c.post(f"/v1/sandboxes/{sandbox}/exec", json=body)
            if r.status_code == 429:
                assert r.headers["retry-after"] == "1"
            else:
                assert r.status_code == 200 and r.json()["stdout"].strip() == str(len(stdin))
            return r.status_code

    with ThreadPoolExecutor(1) as sampler:
        watching = sampler.submit(sample)
        with ThreadPoolExecutor(24) as pool:
            statuses = list(pool.map(big_exec, range(24)))
        sampling = False
        watching.result()
    after = rss_bytes(pid)
    assert set(statuses) <= {200, 429} and 200 in statuses, statuses
    # Each admitted body is held about twice (its chunks, then the joined bytes).
    assert peak - before < 2 * BUDGET_PER_KEY + 48 * MIB, (peak - before) / MIB
    figures["door: 24 concurrent 8 MiB execs"] = {
        "served": statuses.count(200),
        "refused_429": statuses.count(429),
        "per_key_budget_mib": BUDGET_PER_KEY // MIB,
        "rss_before_mib": round(before / MIB, 1),
        "rss_peak_mib": round(peak / MIB, 1),
        "rss_after_mib": round(after / MIB, 1),
    }


# -- 10. failed-key throttling -------------------------------------------------------------------


def test_failed_keys_from_a_shared_address_never_lock_out_a_valid_key(server, keys):
    source = "127.0.10.1"
    transport = httpx.HTTPTransport(local_address=source)
    with httpx.Client(base_url=server.url, transport=transport, timeout=10) as c:
        bad = {"authorization": "Bearer sc_wrong"}
        statuses = [c.get("/v1/sandboxes", headers=bad).status_code for _ in range(20)]
        assert statuses[0] == 401 and statuses[-1] == 429, statuses
        good = {"authorization": f"Bearer {keys['carol']}"}
        for _ in range(3):
            assert c.get("/v1/sandboxes", headers=good).status_code == 200
            r = c.get("/v1/sandboxes", headers=bad)
            assert r.status_code == 429 and assert_error_shape(r)["code"] == "RATE_LIMITED"
            assert int(r.headers["retry-after"]) >= 1
        r = c.get("/v1/sandboxes")  # no key at all is a failure too
        assert r.status_code == 429


# -- 11. a client leaving mid-body ---------------------------------------------------------------


def test_a_client_leaving_mid_body_is_a_disconnect_not_a_500(server, keys):
    log_before = server.log.stat().st_size
    errors_before = _statuses(server).get("500", 0)
    s = _connect(server)
    s.sendall(_partial("/v1/sandboxes", keys["carol"], 1000, b"0123456789"))
    time.sleep(0.2)
    s.close()

    def logged() -> list[str]:
        lines = _log_lines_since(server, log_before)
        return lines if any("499" in line for line in lines) else []

    lines = wait_for(logged, 5, "the disconnect to be logged")
    assert not any("Traceback" in line or "Exception" in line for line in lines), lines
    disconnect = [line for line in lines if "POST /v1/sandboxes" in line]
    assert len(disconnect) == 1 and "client disconnected" in disconnect[0], lines
    by_status = _statuses(server)
    assert by_status.get("500", 0) == errors_before and by_status.get("499", 0) >= 1


# -- 12. forged log lines ------------------------------------------------------------------------

FORGED = "2026-01-01 00:00:00,000 INFO sandcell.access POST /v1/admin 200"


def _forge(server: RunningServer) -> list[str]:
    """Sends `GET /healthz%0a<a forged line>` with no key; the log lines it produced (those
    that mention it or the forged text: another request's line may land meanwhile)."""
    log_before = server.log.stat().st_size
    s = _connect(server)
    target = "/healthz%0a" + FORGED.replace(" ", "%20") + "%1b[2J%e2%80%ae"
    s.sendall(f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    assert _status(_closed_by_server(s, 5) or b"") == 404
    s.close()

    def produced() -> list[str]:
        lines = _log_lines_since(server, log_before)
        return [line for line in lines if "/healthz" in line or "/v1/admin" in line]

    return wait_for(produced, 5, "the access line")


def test_a_percent_encoded_newline_cannot_forge_a_log_line(server):
    lines = _forge(server)
    assert len(lines) == 1, lines
    assert "/healthz\\n2026-01-01" in lines[0] and "\\x1b[2J\\u202e" in lines[0], lines


@pytest.mark.slow
def test_json_logs_escape_request_data_too(tmp_path):
    with servers(tmp_path) as fleet:
        server = fleet.start("json", config_text=config(log_format="json"))
        lines = _forge(server)
    assert len(lines) == 1, lines
    entry = json.loads(lines[0])
    assert entry["message"].startswith("GET /healthz\\n2026-01-01"), entry
    assert "\n" not in entry["message"] and "\x1b" not in entry["message"]


def test_a_request_id_with_control_characters_is_replaced(server):
    """Echoed and logged as is otherwise: only visible ASCII is kept."""
    r = httpx.get(f"{server.url}/healthz", headers={"x-request-id": "a\tb"})
    assert r.status_code == 200 and r.headers["x-request-id"] != "a\tb"
    r = httpx.get(f"{server.url}/healthz", headers={"x-request-id": "client-id-1"})
    assert r.headers["x-request-id"] == "client-id-1"


# -- 13. header size -----------------------------------------------------------------------------


@pytest.mark.parametrize("shape", ["one-big-header", "many-headers", "long-url", "dribbled"])
def test_oversized_request_heads_are_431(server, shape):
    if shape == "one-big-header":
        head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (100 * 1024) + b"\r\n\r\n"
    elif shape == "many-headers":
        fields = b"".join(b"X-H%d: v\r\n" % i for i in range(10_000))
        head = b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + fields + b"\r\n"
    elif shape == "long-url":
        head = b"GET /healthz?" + b"q" * (100 * 1024) + b" HTTP/1.1\r\nHost: x\r\n\r\n"
    else:  # a 32 MiB header that never ends, sent in pieces: refused long before its end
        head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (32 * MIB)
    s = _connect(server)
    sent = 0

    def send() -> None:
        nonlocal sent
        for i in range(0, len(head), 65536):  # stops when the server closes
            try:
                s.sendall(head[i : i + 65536])
            except OSError:
                return
            sent += 65536

    with ThreadPoolExecutor(1) as pool:
        sending = pool.submit(send)
        try:
            answer = _closed_by_server(s, 10)
        finally:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            sending.result()
            s.close()
    assert sent < 4 * MIB, sent  # refused early, not read to the end
    assert answer is not None and _status(answer) == 431, (answer or b"")[:200]
    body = answer.partition(b"\r\n\r\n")[2]
    response = httpx.Response(431, content=body)
    assert assert_error_shape(response)["code"] == "BAD_REQUEST"


def test_a_router_out_of_descriptors_reaps_no_healthy_sandbox(tmp_path):
    """The probe says "inconclusive" on EMFILE, never "dead": the reaper skips, a pool claim
    is a 503 and the pool keeps its cell."""
    daemon = launch_daemon(tmp_path / "daemon")
    try:
        daemon.initialize()
        script = Path(__file__).with_name("out_of_descriptors.py")
        run = subprocess.run(
            [sys.executable, str(script), str(daemon.uds), str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        daemon.stop()
    assert run.returncode == 0, run.stderr[-3000:]
    outcome = json.loads(run.stdout.strip().splitlines()[-1])
    assert outcome == {
        "healthy_before": True,
        "probe": "OVERLOADED",
        "reaped": [[], [], []],
        "claim": "OVERLOADED",
        "still_in_pool": 1,
        "record": True,
        "healthy_after": True,
        "claimed_after": True,
    }, run.stderr[-3000:]
