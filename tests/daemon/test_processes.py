"""Background processes (SPEC §9) against a real daemon: pipes, ptys, signals, replay, attach."""

from __future__ import annotations

import base64
import json
import os
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import ClientConnection, unix_connect

from sandcell import tokens
from sandcell.cellapi.client import DaemonClient
from sandcell.daemon.exec.runner import Runner
from sandcell.daemon.processes import table as proctable
from sandcell.daemon.processes.outputlog import Lost, OutputLog
from support.daemons import RunningDaemon


def start(client: DaemonClient, command: str | list[str], **fields: Any) -> int:
    r = client.signed_request("POST", "/v1/processes", json_body={"command": command, **fields})
    assert r.status_code == 201, r.text
    return r.json()["pid"]


def call(client: DaemonClient, method: str, path: str, **kwargs: Any) -> Any:
    return client.signed_request(method, f"/v1/processes{path}", **kwargs)


def output(client: DaemonClient, pid: int, offset: int = 0, follow: bool = True) -> list[dict]:
    query = f"?follow={str(follow).lower()}&offset={offset}"
    r = call(client, "GET", f"/{pid}/output{query}")
    assert r.status_code == 200, r.text
    return [json.loads(line) for line in r.text.splitlines()]


def text(lines: list[dict], stream: str | None = None) -> bytes:
    return b"".join(
        base64.b64decode(x["data_b64"])
        for x in lines
        if "data_b64" in x and stream in (None, x["type"])
    )


def wait_for(client: DaemonClient, pid: int, needle: bytes, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while needle not in text(output(client, pid, follow=False)):
        assert time.monotonic() < deadline, f"{needle!r} never appeared"
        time.sleep(0.02)


def attach(daemon: RunningDaemon, pid: int, token: str | None = None) -> ClientConnection:
    path = f"/v1/processes/{pid}/ws"
    if token is None:
        token = tokens.mint_request_token(daemon.session_key, daemon.sandbox_id, "GET", path)
    return unix_connect(
        str(daemon.uds),
        uri=f"ws://sandcell-daemon{path}",
        additional_headers={"authorization": f"Bearer {token}"},
        open_timeout=5,
    )


@pytest.fixture
def kill_all(client: DaemonClient) -> Iterator[None]:
    yield
    for p in call(client, "GET", "").json()["processes"]:
        if p["state"] == "running":
            call(client, "DELETE", f"/{p['pid']}")


def test_start_returns_at_once_and_process_keeps_running(client: DaemonClient, kill_all: None):
    started = time.monotonic()
    pid = start(client, "echo up; sleep 30", tag="server")
    assert time.monotonic() - started < 2
    wait_for(client, pid, b"up\n")
    info = call(client, "GET", f"/{pid}").json()
    assert info["state"] == "running" and info["tag"] == "server" and info["pty"] is False
    assert pid in [p["pid"] for p in call(client, "GET", "").json()["processes"]]


def test_cat_echoes_stdin_and_ends_on_close(client: DaemonClient):
    pid = start(client, "cat", stdin=True)
    assert call(client, "POST", f"/{pid}/stdin", content=b"first\n").status_code == 204
    assert call(client, "POST", f"/{pid}/stdin", content=b"second\n").status_code == 204
    assert call(client, "POST", f"/{pid}/stdin/close").status_code == 204
    lines = output(client, pid)
    assert text(lines, "stdout") == b"first\nsecond\n"
    assert lines[-1] == {"type": "exit", "exit_code": 0, "signal": None, "timed_out": False}
    assert call(client, "POST", f"/{pid}/stdin", content=b"late").status_code == 409


@pytest.mark.parametrize("sig", ["SIGUSR1", "usr1", 10])
def test_trap_sees_signal_by_name_or_number(client: DaemonClient, sig: str | int):
    script = "trap 'echo got-usr1; exit 7' USR1; echo ready; while :; do sleep 0.02; done"
    pid = start(client, script)
    wait_for(client, pid, b"ready")
    assert call(client, "POST", f"/{pid}/signal", json_body={"signal": sig}).status_code == 204
    lines = output(client, pid)
    assert b"got-usr1" in text(lines) and lines[-1]["exit_code"] == 7


def test_pty_process_has_a_terminal_that_follows_resize(client: DaemonClient):
    script = "tty; stty size; read _; stty size; echo term=$TERM"
    pid = start(client, script, pty={"cols": 100, "rows": 30})
    wait_for(client, pid, b"30 100")
    r = call(client, "POST", f"/{pid}/resize", json_body={"cols": 132, "rows": 43})
    assert r.status_code == 204
    assert call(client, "POST", f"/{pid}/stdin", content=b"\n").status_code == 204
    out = text(output(client, pid))
    assert b"/dev/pts/" in out and b"43 132" in out and b"term=xterm-256color" in out


def test_pty_job_control_and_ctrl_c(client: DaemonClient):
    pid = start(client, ["/bin/bash", "--norc", "-i"], pty={"cols": 80, "rows": 24})
    call(client, "POST", f"/{pid}/stdin", content=b"sleep 30\n")
    time.sleep(0.3)
    call(client, "POST", f"/{pid}/stdin", content=b"\x03echo after-$?\n")  # Ctrl-C: SIGINT
    wait_for(client, pid, b"after-130")
    call(client, "POST", f"/{pid}/stdin", content=b"exit 5\n")
    assert output(client, pid)[-1]["exit_code"] == 5


def test_websocket_session_on_a_pty(daemon: RunningDaemon, client: DaemonClient):
    pid = start(client, ["/bin/sh"], pty={"cols": 80, "rows": 24})
    with attach(daemon, pid) as ws:
        ws.send(b"echo $((6*7))\n")
        seen = b""
        while b"42\r\n" not in seen:
            seen += ws.recv(timeout=10)
        ws.send(json.dumps({"type": "resize", "cols": 90, "rows": 33}))
        ws.send(b"stty size; exit 3\n")
        frames = []
        while not (frames and isinstance(frames[-1], str)):
            frames.append(ws.recv(timeout=10))
    assert b"33 90" in b"".join(f for f in frames if isinstance(f, bytes))
    assert json.loads(frames[-1]) == {
        "type": "exit",
        "exit_code": 3,
        "signal": None,
        "timed_out": False,
    }


def test_a_control_frame_nested_past_the_parsers_depth_is_an_error_frame(
    daemon: RunningDaemon, client: DaemonClient
):
    pid = start(client, ["/bin/sh"], pty={"cols": 80, "rows": 24})
    with attach(daemon, pid) as ws:
        ws.send("[" * 100_000 + "]" * 100_000)
        while isinstance(frame := ws.recv(timeout=10), bytes):
            pass  # the shell's prompt
        error = json.loads(frame)
        assert error["type"] == "error" and error["code"] == "BAD_REQUEST"
        ws.send(b"echo $((6*7)); exit 0\n")  # the session goes on
        seen = b""
        while b"42\r\n" not in seen:
            frame = ws.recv(timeout=10)
            seen += frame if isinstance(frame, bytes) else b""


def test_websocket_without_valid_token_is_refused_before_upgrade(
    daemon: RunningDaemon, client: DaemonClient, kill_all: None
):
    pid = start(client, "sleep 30")
    other_path = tokens.mint_request_token(
        daemon.session_key, daemon.sandbox_id, "GET", f"/v1/processes/{pid}/output"
    )
    post = tokens.mint_request_token(
        daemon.session_key, daemon.sandbox_id, "POST", f"/v1/processes/{pid}/ws"
    )
    forged = tokens.mint_request_token(
        tokens.generate_p256(), daemon.sandbox_id, "GET", f"/v1/processes/{pid}/ws"
    )
    other_sandbox = tokens.mint_request_token(
        daemon.session_key, "sbx-another", "GET", f"/v1/processes/{pid}/ws"
    )
    replayed = tokens.mint_request_token(
        daemon.session_key, daemon.sandbox_id, "GET", f"/v1/processes/{pid}/ws"
    )
    with attach(daemon, pid, replayed):
        pass  # used once: fine
    for token in ("", "garbage", other_path, post, forged, other_sandbox, replayed):
        with pytest.raises(InvalidStatus) as refused:
            attach(daemon, pid, token)
        assert refused.value.response.status_code == 401
        assert json.loads(refused.value.response.body)["error"]["code"] == "UNAUTHENTICATED"


def test_bad_input(client: DaemonClient, kill_all: None):
    for unknown in ("/999999", "/abc", "/999999/output"):
        r = call(client, "GET", unknown)
        assert r.status_code == 404 and r.json()["error"]["code"] == "NOT_FOUND"
    pid = start(client, "sleep 30")
    assert call(client, "POST", f"/{pid}/stdin", content=b"x").status_code == 409
    assert call(client, "POST", f"/{pid}/stdin/close").status_code == 409
    resize = call(client, "POST", f"/{pid}/resize", json_body={"cols": 10, "rows": 10})
    assert resize.status_code == 409
    for bad in ("SIGNOPE", 0, 999, "", -1):
        r = call(client, "POST", f"/{pid}/signal", json_body={"signal": bad})
        assert r.status_code == 400 and r.json()["error"]["code"] == "BAD_REQUEST", bad
    assert call(client, "GET", f"/{pid}/output?offset=-1").status_code == 400
    r = client.signed_request("POST", "/v1/processes", json_body={"command": ["/no/such"]})
    assert r.status_code == 400


def test_at_most_64_running(client: DaemonClient, kill_all: None):
    pids = [start(client, ["sleep", "30"]) for _ in range(64)]
    r = client.signed_request("POST", "/v1/processes", json_body={"command": "true"})
    assert r.status_code == 429 and r.json()["error"]["code"] == "RATE_LIMITED"
    assert call(client, "DELETE", f"/{pids[0]}").status_code == 204
    output(client, pids[0])  # returns once it has exited
    start(client, "true")


def test_delete_kills_the_whole_tree(client: DaemonClient, daemon: RunningDaemon):
    marker = daemon.workspace / "tree.pids"
    pid = start(client, f"setsid sleep 300 & echo $! > {marker}; sleep 300 & wait")
    deadline = time.monotonic() + 5
    while not (marker.exists() and marker.read_text().strip()):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    escaped = int(marker.read_text())
    assert call(client, "DELETE", f"/{pid}").status_code == 204
    assert output(client, pid)[-1]["signal"] == 9
    assert not os.path.exists(f"/proc/{escaped}") or _zombie(escaped)


def _zombie(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "Z"


def test_timeout_kills(client: DaemonClient):
    pid = start(client, "sleep 30", timeout_s=0.5)
    assert output(client, pid)[-1] == {
        "type": "exit",
        "exit_code": 124,
        "signal": 9,
        "timed_out": True,
    }


def test_reader_reconnecting_with_offset_gets_exactly_what_it_missed(client: DaemonClient):
    pid = start(client, "for i in $(seq 1 200); do echo line-$i; echo err-$i >&2; done")
    whole = output(client, pid)
    everything = text(whole)
    assert everything.count(b"line-") == 200 and everything.count(b"err-") == 200
    for cut in (0, 7, len(everything) // 2, len(everything) - 1, len(everything)):
        assert text(output(client, pid, offset=cut)) == everything[cut:]


def test_rotated_output_is_reported_lost(client: DaemonClient):
    """Without a follower, a stream keeps its last bytes; a late reader learns what it lost.
    (The output is held for the first live reader: one comes and goes at once here.)"""
    pid = start(client, "sleep 0.2; head -c 50000 /dev/zero | tr '\\0' a", max_buffer_bytes=1024)
    path = f"/v1/processes/{pid}/output?follow=true"
    with client.http.stream("GET", path, headers=_auth(client, path)) as r:
        assert r.status_code == 200
    wait_exited(client, pid)
    lines = output(client, pid)
    assert lines[0]["type"] == "lost"
    assert 0 < len(text(lines)) <= 1024
    assert len(text(lines)) + lines[0]["bytes"] == 50000
    assert lines[-1]["type"] == "exit"


def wait_exited(client: DaemonClient, pid: int) -> None:
    deadline = time.monotonic() + 10
    while call(client, "GET", f"/{pid}").json()["state"] != "exited":
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_follower_gets_every_byte_with_bounded_buffer(client: DaemonClient):
    """A live follower holds the command back rather than losing output."""
    size = 6 * 1_048_576
    pid = start(client, f"head -c {size} /dev/urandom | od -An -v -tx1 | head -c {size}")
    path = f"/v1/processes/{pid}/output?follow=true"
    total, lost = 0, 0
    with client.http.stream("GET", path, headers=_auth(client, path)) as r:
        for line in r.iter_lines():
            item = json.loads(line)
            if item["type"] == "lost":
                lost += item["bytes"]
            elif "data_b64" in item:
                total += len(base64.b64decode(item["data_b64"]))
                time.sleep(0.0005)  # a slow reader
    assert (total, lost) == (size, 0)


def _auth(client: DaemonClient, path: str) -> dict[str, str]:
    assert client.session_key is not None
    token = tokens.mint_request_token(client.session_key, client.sandbox_id, "GET", path)
    return {"authorization": f"Bearer {token}"}


def test_exited_records_are_kept_up_to_64(client: DaemonClient):
    pids = [start(client, "true") for _ in range(70)]
    output(client, pids[-1])
    time.sleep(0.3)
    listed = {p["pid"] for p in call(client, "GET", "").json()["processes"]}
    assert pids[-1] in listed and pids[0] not in listed
    assert call(client, "GET", f"/{pids[0]}").status_code == 404


def test_streamed_exec_is_complete_and_holds_the_command_back(
    client: DaemonClient, daemon: RunningDaemon
):
    """NDJSON exec delivers every byte past max_output_bytes; a reader that stops reading
    stops the command (its pipe fills) instead of growing the daemon's memory."""
    size = 16 * 1_048_576
    marker = daemon.workspace / "stream-done"
    command = f"head -c {size} /dev/zero | tr '\\0' x; touch {marker}"
    body = json.dumps({"command": command, "max_output_bytes": 1024}).encode()
    token = tokens.mint_request_token(
        daemon.session_key, daemon.sandbox_id, "POST", "/v1/exec", body
    )
    headers = {"authorization": f"Bearer {token}", "accept": "application/x-ndjson"}
    total, exit_line = 0, None
    with client.http.stream("POST", "/v1/exec", content=body, headers=headers) as r:
        for n, line in enumerate(r.iter_lines()):
            item = json.loads(line)
            if item["type"] == "stdout":
                total += len(item["data"])
            else:
                exit_line = item
            if n == 1:
                time.sleep(1.0)  # the reader stalls: the command must stall too
                assert not marker.exists()
    assert total == size
    assert exit_line is not None and exit_line["exit_code"] == 0
    assert exit_line["stdout_truncated"] is False
    assert marker.exists()


def test_running_buffers_have_a_total_budget(client: DaemonClient, kill_all: None):
    big = {"max_buffer_bytes": 8 * 1_048_576}  # two streams: 16 MiB reserved each
    deadline = time.monotonic() + 10
    while any(p["state"] == "running" for p in call(client, "GET", "").json()["processes"]):
        assert time.monotonic() < deadline  # earlier tests' processes are gone
        time.sleep(0.05)
    pids = [start(client, "sleep 30", **big) for _ in range(8)]
    small = {"command": "true", "max_buffer_bytes": 1024}
    for body in ({"command": "true", **big}, small):
        r = client.signed_request("POST", "/v1/processes", json_body=body)
        assert r.status_code == 429 and "budget" in r.json()["error"]["message"]
    call(client, "DELETE", f"/{pids[0]}")
    output(client, pids[0])  # returns once it has exited: its reservation is released
    start(client, **small)


@pytest.mark.anyio
async def test_exited_output_has_a_total_budget(monkeypatch: pytest.MonkeyPatch):
    """The oldest exited processes' output goes first; their records stay."""
    monkeypatch.setattr(proctable, "EXITED_OUTPUT_BUDGET", 100_000)
    table = proctable.ProcessTable(Runner())
    logs = []
    for pid in (101, 102, 103):
        log = OutputLog(proctable.PIPE_STREAMS)
        log.append("stdout", b"x" * 60_000)
        log.close()
        logs.append(log)
        table._finished(SimpleNamespace(pid=pid, log=log))  # as a process's supervisor does
    first, second, last = logs
    assert first.read(0)[0] == [Lost(60_000)] and second.read(0)[0] == [Lost(60_000)]
    assert last.retained == 60_000
    assert [table.get(pid).pid for pid in (101, 102, 103)] == [101, 102, 103]


def test_start_with_follow_answers_the_process_then_its_output(client: DaemonClient):
    """One call for a client that starts and follows (the E2B façade's Start)."""
    r = client.signed_request(
        "POST", "/v1/processes?follow=true", json_body={"command": "echo one; echo two >&2"}
    )
    assert r.status_code == 201, r.text
    lines = [json.loads(line) for line in r.text.splitlines()]
    assert lines[0]["type"] == "process" and lines[0]["state"] == "running"
    assert text(lines, "stdout") == b"one\n" and text(lines, "stderr") == b"two\n"
    assert lines[-1] == {"type": "exit", "exit_code": 0, "signal": None, "timed_out": False}
    assert output(client, lines[0]["pid"], follow=False)[-1]["type"] == "exit"
    bad = client.signed_request("POST", "/v1/processes?follow=maybe", json_body={"command": "true"})
    assert bad.status_code == 400
