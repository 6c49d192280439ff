"""Commands and terminals through the unmodified e2b SDK: foreground, background, stdin, pty."""

from __future__ import annotations

import re
import time

import pytest
from e2b import Sandbox
from e2b.exceptions import SandboxException
from e2b.sandbox.commands.command_handle import PtySize

from support.server import RunningServer

pytestmark = pytest.mark.slow


def test_foreground_callbacks_env_and_cwd(sbx: Sandbox) -> None:
    out: list[str] = []
    err: list[str] = []
    sbx.files.make_dir("/home/user/work")
    result = sbx.commands.run(
        "echo $GREETING; pwd; echo bad >&2",
        envs={"GREETING": "hi"},
        cwd="/home/user/work",
        on_stdout=out.append,
        on_stderr=err.append,
    )
    lines = result.stdout.splitlines()
    assert lines[0] == "hi"
    assert lines[1].endswith("/work")
    assert "".join(out) == result.stdout
    assert "".join(err) == "bad\n"


def test_cwd_elsewhere_in_the_cell(sbx: Sandbox) -> None:
    assert sbx.commands.run("pwd", cwd="/").stdout == "/\n"
    assert sbx.commands.run("pwd", cwd="/tmp").stdout == "/tmp\n"


def test_background_list_kill(sbx: Sandbox) -> None:
    handle = sbx.commands.run("sleep 60", background=True)
    assert handle.pid in [p.pid for p in sbx.commands.list()]
    assert sbx.commands.kill(handle.pid)
    deadline = time.monotonic() + 10
    while handle.pid in [p.pid for p in sbx.commands.list()] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert handle.pid not in [p.pid for p in sbx.commands.list()]


def test_background_stdin_and_wait(sbx: Sandbox) -> None:
    seen: list[str] = []
    handle = sbx.commands.run("head -n 1", background=True, stdin=True)
    sbx.commands.send_stdin(handle.pid, "typed line\n")
    result = handle.wait(on_stdout=seen.append)  # the sync SDK calls back while waiting
    assert result.exit_code == 0
    assert result.stdout == "typed line\n"
    assert "".join(seen) == "typed line\n"


def test_connect_to_a_running_command(sbx: Sandbox) -> None:
    handle = sbx.commands.run("sleep 0.5; echo done", background=True)
    again = sbx.commands.connect(handle.pid)
    assert again.wait().stdout == "done\n"


def _inflight(server: RunningServer) -> float:
    with server.client() as client:
        text = client.get("/metrics").text
    return float(re.search(r"^sandcell_inflight_requests ([0-9.e+]+)$", text, re.M)[1])


def test_a_client_that_leaves_a_stream_frees_its_request(
    sbx: Sandbox, e2b_server: RunningServer
) -> None:
    """The stream of a command stops when its client goes: the request, with its slot and
    its hop to the daemon, ends then, not when the command does (http/streamed.py)."""
    before = _inflight(e2b_server)
    handle = sbx.commands.run("sleep 60", background=True)
    assert _inflight(e2b_server) == before + 1  # the Start stream, held open by the handle
    handle.disconnect()
    deadline = time.monotonic() + 10
    while _inflight(e2b_server) > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _inflight(e2b_server) == before
    assert handle.pid in [p.pid for p in sbx.commands.list()]  # the command runs on
    assert sbx.commands.kill(handle.pid)


def test_pty(sbx: Sandbox) -> None:
    data = bytearray()
    terminal = sbx.pty.create(PtySize(rows=24, cols=80))
    sbx.pty.resize(terminal.pid, PtySize(rows=30, cols=100))
    sbx.pty.send_stdin(terminal.pid, b"stty size; exit\n")
    terminal.wait(on_pty=data.extend)
    assert b"30 100" in bytes(data)


def test_a_kill_ends_a_waiting_command() -> None:
    """The sandbox goes while a command is followed: the wait ends with E2B's error."""
    doomed = Sandbox.create()
    handle = doomed.commands.run("sleep 60", background=True)
    started = time.monotonic()
    doomed.kill()
    with pytest.raises(SandboxException):
        handle.wait()
    assert time.monotonic() - started < 30
