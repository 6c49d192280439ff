"""Processes and terminals (SPEC §9) through a real `sandcell serve` and real cells."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import time
from collections.abc import Iterator

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from support.server import RunningServer, start_server

pytestmark = pytest.mark.slow

CONFIG = """
[server]
reap_interval_s = 1

[templates.default]
memory_mb = 256
pids_max = 256
disk_mb = 128
warm_pool = 1
idle_timeout_s = 300
network = "loopback"
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    srv = start_server(tmp_path_factory.mktemp("procs") / "data", config_text=CONFIG)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def key(server: RunningServer) -> str:
    return server.create_key("procs")


@pytest.fixture
def sandbox(server: RunningServer, key: str) -> Iterator[tuple[httpx.Client, str]]:
    with server.client(key) as c:
        r = c.post("/v1/sandboxes", json={})
        assert r.status_code == 201, r.text
        base = f"/v1/sandboxes/{r.json()['id']}"
        yield c, base
        c.delete(base)


def start(c: httpx.Client, base: str, command: str | list[str], **fields: object) -> int:
    r = c.post(f"{base}/processes", json={"command": command, **fields})
    assert r.status_code == 201, r.text
    return r.json()["pid"]


def output(c: httpx.Client, base: str, pid: int, offset: int = 0) -> list[dict]:
    r = c.get(f"{base}/processes/{pid}/output", params={"follow": "true", "offset": offset})
    assert r.status_code == 200, r.text
    return [json.loads(line) for line in r.text.splitlines()]


def data(lines: list[dict]) -> bytes:
    return b"".join(base64.b64decode(x["data_b64"]) for x in lines if "data_b64" in x)


def ws_url(server: RunningServer, path: str) -> str:
    return "ws" + server.url.removeprefix("http") + path


def attach(server: RunningServer, path: str, key: str | None) -> ClientConnection:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return connect(ws_url(server, path), additional_headers=headers, open_timeout=10)


def type_and_see(ws: ClientConnection, keys: bytes, expected: bytes) -> None:
    ws.send(keys)
    seen = b""
    while expected not in seen:
        seen += ws.recv(timeout=10)


def next_text_frame(ws: ClientConnection) -> str:
    """Skips output (binary frames) up to the next control frame."""
    while isinstance(frame := ws.recv(timeout=10), bytes):
        pass
    return frame


def test_dev_server_keeps_answering_after_its_request_returned(sandbox):
    c, base = sandbox
    start(c, base, "python3 -m http.server 8123 --bind 127.0.0.1", tag="web")
    probe = (
        'python3 -c "import urllib.request as u; '
        "print(u.urlopen('http://127.0.0.1:8123/').status)\""
    )
    deadline = time.monotonic() + 20
    while True:
        r = c.post(f"{base}/exec", json={"command": probe, "timeout_s": 10}).json()
        if r["stdout"].strip() == "200":
            break
        assert time.monotonic() < deadline, r
        time.sleep(0.2)
    time.sleep(1)  # still there a while later, from another request
    assert c.post(f"{base}/exec", json={"command": probe}).json()["stdout"].strip() == "200"
    listed = c.get(f"{base}/processes").json()["processes"]
    assert [p["state"] for p in listed if p["tag"] == "web"] == ["running"]


def test_stdin_signals_and_replay(sandbox):
    c, base = sandbox
    pid = start(c, base, "cat", stdin=True)
    assert c.post(f"{base}/processes/{pid}/stdin", content=b"echoed\n").status_code == 204
    assert c.post(f"{base}/processes/{pid}/stdin/close").status_code == 204
    lines = output(c, base, pid)
    assert data(lines) == b"echoed\n" and lines[-1]["exit_code"] == 0

    trap = "trap 'echo usr1; exit 9' USR1; echo armed; while :; do sleep 0.05; done"
    pid = start(c, base, trap)
    deadline = time.monotonic() + 10
    while b"armed" not in data(output_now(c, base, pid)):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    r = c.post(f"{base}/processes/{pid}/signal", json={"signal": "SIGUSR1"})
    assert r.status_code == 204
    lines = output(c, base, pid)
    assert b"usr1" in data(lines) and lines[-1]["exit_code"] == 9

    pid = start(c, base, "for i in $(seq 1 300); do echo out-$i; echo err-$i >&2; done")
    everything = data(output(c, base, pid))
    for cut in (1, len(everything) // 3, len(everything) - 2):
        assert data(output(c, base, pid, offset=cut)) == everything[cut:]


def output_now(c: httpx.Client, base: str, pid: int) -> list[dict]:
    r = c.get(f"{base}/processes/{pid}/output", params={"follow": "false"})
    return [json.loads(line) for line in r.text.splitlines()]


def test_pty_resize_and_bad_input(sandbox):
    c, base = sandbox
    pid = start(c, base, "read _; stty size", pty={"cols": 80, "rows": 24})
    assert c.post(f"{base}/processes/{pid}/resize", json={"cols": 101, "rows": 31}).status_code
    c.post(f"{base}/processes/{pid}/stdin", content=b"\n")
    assert b"31 101" in data(output(c, base, pid))
    plain = start(c, base, "sleep 30")
    checks = [
        (c.get(f"{base}/processes/424242"), 404, "NOT_FOUND"),
        (c.post(f"{base}/processes/{plain}/stdin", content=b"x"), 409, "CONFLICT"),
        (c.post(f"{base}/processes/{plain}/resize", json={"cols": 1, "rows": 1}), 409, "CONFLICT"),
        (c.post(f"{base}/processes/{plain}/signal", json={"signal": "SIGBOGUS"}), 400, None),
    ]
    for r, status, code in checks:
        assert r.status_code == status, r.text
        assert code is None or r.json()["error"]["code"] == code
    assert c.delete(f"{base}/processes/{plain}").status_code == 204


def test_websocket_shell_through_the_router(server, key, sandbox):
    c, base = sandbox
    pid = start(c, base, ["/bin/sh"], pty={"cols": 80, "rows": 24})
    with attach(server, f"{base}/processes/{pid}/ws", key) as ws:
        type_and_see(ws, b"echo $((6*7))\n", b"42")
        ws.send(b"exit 3\n")
        last = next_text_frame(ws)
    assert json.loads(last) == {"type": "exit", "exit_code": 3, "signal": None, "timed_out": False}


def test_websocket_refusals_happen_before_the_upgrade(server, key, sandbox):
    _, base = sandbox
    path = f"{base}/processes/1/ws"
    other = server.create_key(f"other-{secrets.token_hex(3)}")
    for token, status in ((None, 401), ("sc_bogus", 401), (other, 404), (key, 404)):
        with pytest.raises(InvalidStatus) as refused:
            attach(server, path if token != key else f"{base}/processes/999999/ws", token)
        assert refused.value.response.status_code == status


def test_cap_metrics_and_everything_dies_at_delete(server, key):
    marker = f"mark{secrets.token_hex(6)}"
    with server.client(key) as c:
        base = f"/v1/sandboxes/{c.post('/v1/sandboxes', json={}).json()['id']}"
        pids = [start(c, base, f"sleep 600; : {marker}") for _ in range(64)]
        r = c.post(f"{base}/processes", json={"command": "true"})
        assert r.status_code == 429 and r.json()["error"]["code"] == "RATE_LIMITED"
        assert len(pids) == 64 and len(_host_pids(marker)) == 64

        c.put(f"{base}/files", params={"path": "blob"}, content=os.urandom(1_048_576))
        m = c.get(f"{base}/metrics").json()
        assert m["pids"] >= 64 and m["pids_limit"] == 256
        assert 0 < m["memory_bytes"] < m["memory_limit_bytes"] == 256 * 1_048_576
        assert m["disk_used_bytes"] >= 1_048_576 and m["disk_limit_bytes"] == 128 * 1_048_576
        assert m["cpu_used_s"] >= 0 and m["cpu_percent"] >= 0 and m["cpus"] == 1.0

        assert c.delete(base).status_code == 204
        assert c.get(f"{base}/metrics").status_code == 404
    deadline = time.monotonic() + 10
    while _host_pids(marker):
        assert time.monotonic() < deadline, "processes outlived their sandbox"
        time.sleep(0.1)


def _host_pids(marker: str) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        found.append(int(name))
            except OSError:
                pass
    return found


def test_killing_the_process_closes_the_websocket(server, key, sandbox):
    c, base = sandbox
    pid = start(c, base, ["/bin/sh"], pty={"cols": 80, "rows": 24})
    with attach(server, f"{base}/processes/{pid}/ws", key) as ws:
        type_and_see(ws, b"echo ready\n", b"ready\r\n")
        assert c.delete(f"{base}/processes/{pid}").status_code == 204
        last = next_text_frame(ws)
        assert json.loads(last)["signal"] == 9
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=10)


def test_the_signal_route_reaches_only_the_tables_processes(sandbox):
    c, base = sandbox
    for pid in (1, 2, 3):  # the cell's first processes: its launcher and the daemon
        r = c.post(f"{base}/processes/{pid}/signal", json={"signal": "SIGKILL"})
        assert r.status_code == 404, r.text
    assert c.post(f"{base}/exec", json={"command": "true"}).status_code == 200


def test_kill_minus_one_ends_the_users_processes_only(sandbox):
    """A background process is the user's too: `kill -9 -1` ends it, never the daemon."""
    c, base = sandbox
    victim = start(c, base, "sleep 600")
    killer = start(c, base, "sleep 0.5; kill -9 -1; echo still-here")
    assert output(c, base, killer)[-1]["type"] == "exit"
    assert output(c, base, victim)[-1]["signal"] == 9
    r = c.post(f"{base}/exec", json={"command": "echo alive"})
    assert r.status_code == 200 and r.json()["stdout"] == "alive\n"


def test_a_websocket_session_counts_as_activity(server, key):
    """A terminal in use keeps an idle-timed sandbox alive; once it is closed, the idle
    timeout runs out and the sandbox is reaped."""
    with server.client(key) as c:
        r = c.post("/v1/sandboxes", json={"idle_timeout_s": 3})
        base = f"/v1/sandboxes/{r.json()['id']}"
        pid = start(c, base, "stty raw -echo; exec cat", pty={"cols": 80, "rows": 24})
        with attach(server, f"{base}/processes/{pid}/ws", key) as ws:
            for _ in range(14):  # 7 s of typing, past the 3 s idle timeout
                ws.send(b"k")
                time.sleep(0.5)
        assert c.get(base).json()["state"] == "running"
        deadline = time.monotonic() + 20
        while c.get(base).status_code != 404:
            assert time.monotonic() < deadline, "an idle sandbox was not reaped"
            time.sleep(0.5)


def test_websocket_sessions_are_bounded_per_key(server, sandbox):
    """Each session holds two connections in the router: one key cannot exhaust them."""
    c, base = sandbox
    key = server.create_key(f"many-{secrets.token_hex(3)}")
    pid = start(c, base, "sleep 600")
    path = f"{base}/processes/{pid}/ws"
    # The sandbox is another key's: 404 before the per-key count is even looked at.
    with pytest.raises(InvalidStatus) as refused:
        attach(server, path, key)
    assert refused.value.response.status_code == 404
    owner = c.headers["authorization"].removeprefix("Bearer ")
    with contextlib.ExitStack() as stack:
        for _ in range(64):
            stack.enter_context(attach(server, path, owner))
        with pytest.raises(InvalidStatus) as refused:
            attach(server, path, owner)
        assert refused.value.response.status_code == 429
    deadline = time.monotonic() + 10
    while True:  # closed sessions free their slots (once the router has seen them close)
        try:
            with attach(server, path, owner):
                break
        except InvalidStatus:
            assert time.monotonic() < deadline, "slots were not released"
            time.sleep(0.1)
