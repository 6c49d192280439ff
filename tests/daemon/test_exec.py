"""`POST /v1/exec` against a real daemon: forms, stdin, timeouts, caps, exit codes, streaming."""

from __future__ import annotations

import json
import os
import time

import pytest

from sandcell.cellapi.client import DaemonClient
from support.daemons import RunningDaemon


def test_shell_string_and_argv(client: DaemonClient):
    assert client.exec("echo $((1+2)) | wc -c")["stdout"].strip() == "2"
    r = client.exec(["/usr/bin/printf", "%s|", "a b", "$HOME"])
    assert r["stdout"] == "a b|$HOME|"  # no shell: nothing expanded


def test_cwd_inside_workspace(client: DaemonClient, daemon: RunningDaemon):
    (daemon.workspace / "sub" / "dir").mkdir(parents=True, exist_ok=True)
    assert client.exec("pwd", cwd="sub/dir")["stdout"] == f"{daemon.workspace}/sub/dir\n"
    absolute = client.exec("pwd", cwd=f"{daemon.workspace}/sub")
    assert absolute["stdout"] == f"{daemon.workspace}/sub\n"


@pytest.mark.parametrize("cwd", ["..", "/etc", "sub/../../x"])
def test_cwd_outside_forbidden(client: DaemonClient, cwd: str):
    r = client.signed_request("POST", "/v1/exec", json_body={"command": "pwd", "cwd": cwd})
    assert r.status_code == 403, r.text


def test_cwd_missing_is_404(client: DaemonClient):
    r = client.signed_request("POST", "/v1/exec", json_body={"command": "pwd", "cwd": "nope"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "FILE_NOT_FOUND"


def test_stdin_closed_by_default_and_given(client: DaemonClient):
    started = time.monotonic()
    assert client.exec("cat")["stdout"] == ""
    assert time.monotonic() - started < 5  # would hang forever on an open stdin
    assert client.exec("cat", stdin="fed\n")["stdout"] == "fed\n"


def test_exit_codes(client: DaemonClient):
    assert client.exec("exit 7")["exit_code"] == 7
    killed = client.exec("kill -TERM $$")
    assert killed["exit_code"] == 128 + 15 and killed["signal"] == 15
    missing = client.exec(["/no/such/binary"])
    assert missing["exit_code"] == 127 and "/no/such/binary" in missing["stderr"]
    assert client.exec("no-such-command-here")["exit_code"] == 127


def test_timeout_kills_whole_tree_promptly(client: DaemonClient, daemon: RunningDaemon):
    marker = daemon.workspace / "grandchild.pid"
    # A grandchild that escapes the process group and session, holding stdout open.
    script = f"setsid sh -c 'echo $$ > {marker}; exec sleep 300' & sleep 300 & echo started; wait"
    started = time.monotonic()
    r = client.exec(script, timeout_s=1)
    elapsed = time.monotonic() - started
    assert r["timed_out"] is True and r["exit_code"] == 124
    assert r["stdout"] == "started\n"
    assert elapsed < 3, elapsed
    pid = int(marker.read_text())
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.05)
    assert not _alive(pid), "setsid grandchild survived the timeout"


def test_background_descendant_keeps_running(client: DaemonClient, daemon: RunningDaemon):
    marker = daemon.workspace / "bg.pid"
    started = time.monotonic()
    r = client.exec(f"sleep 30 & echo $! > {marker}; echo done")
    assert r["stdout"] == "done\n" and r["exit_code"] == 0
    assert time.monotonic() - started < 2  # returns after the ~100 ms grace
    pid = int(marker.read_text())
    assert _alive(pid)
    os.kill(pid, 9)


def test_output_cap_keeps_head_and_flags(client: DaemonClient):
    r = client.exec("head -c 100000 /dev/zero | tr '\\0' a; echo tail >&2", max_output_bytes=1000)
    assert r["stdout"] == "a" * 1000 and r["stdout_truncated"] is True
    assert r["stderr"] == "tail\n" and r["stderr_truncated"] is False
    assert r["exit_code"] == 0


def test_non_utf8_replaced(client: DaemonClient):
    r = client.exec(["printf", "ok\\377\\376end"])
    assert r["stdout"] == "ok\ufffd\ufffdend"


def test_streaming_delivers_before_exit(client: DaemonClient):
    body = {"command": "echo first; sleep 1; echo second >&2; exit 3"}
    started = time.monotonic()
    arrivals = []
    with client.http.stream(
        "POST",
        "/v1/exec",
        content=json.dumps(body).encode(),
        headers=_signed_headers(client, body, {"accept": "application/x-ndjson"}),
    ) as response:
        assert response.headers["content-type"].startswith("application/x-ndjson")
        for line in response.iter_lines():
            if line:
                arrivals.append((time.monotonic() - started, json.loads(line)))
    kinds = [event["type"] for _, event in arrivals]
    assert kinds == ["stdout", "stderr", "exit"]
    assert arrivals[0][1]["data"] == "first\n" and arrivals[0][0] < 0.8
    exit_event = arrivals[-1][1]
    assert exit_event["exit_code"] == 3 and "stdout" not in exit_event


def _signed_headers(client: DaemonClient, body: dict, extra: dict[str, str]) -> dict[str, str]:
    from sandcell import tokens

    raw = json.dumps(body).encode()
    token = tokens.mint_request_token(
        client.session_key, client.sandbox_id, "POST", "/v1/exec", raw
    )
    return {"authorization": f"Bearer {token}", "content-type": "application/json", **extra}


@pytest.mark.parametrize(
    "body",
    [
        {"command": ""},
        {"command": []},
        {"command": ["a\0b"]},
        {"command": "true", "timeout_s": 0},
        {"command": "true", "timeout_s": 86401},
        {"command": "true", "max_output_bytes": -1},
        {"command": "true", "unknown": 1},
        {"command": 42},
        {"command": "true", "env": {"A": 1}},
        {},
    ],
)
def test_bad_exec_bodies_are_400(client: DaemonClient, body: dict):
    r = client.signed_request("POST", "/v1/exec", json_body=body)
    assert r.status_code == 400 and r.json()["error"]["code"] == "BAD_REQUEST", r.text


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_commands_are_the_oom_killers_first_choice(client: DaemonClient):
    assert client.exec("cat /proc/self/oom_score_adj")["stdout"] == "1000\n"


def test_result_json_is_encoded_piecewise_and_exact():
    import json as _json

    from sandcell.daemon.exec.runner import CappedOutput, CommandResult

    out = CappedOutput(100)
    for piece in (b'a"\\\n', b"\xc3", b"\xa9 ok", b"\xff"):  # an \xc3\xa9 split across chunks
        out.add(piece)
    result = CommandResult(3, out, CappedOutput(10), False, None, 0.5)
    doc = _json.loads(b"".join(result.iter_json()))
    assert doc["stdout"] == 'a"\\\n\u00e9 ok\ufffd' and doc["stderr"] == ""
    assert doc["exit_code"] == 3 and doc["duration_s"] == 0.5
