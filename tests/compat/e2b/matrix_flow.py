"""The version matrix's scripted flow (docs/e2b.md): run as a script by every Python row's
interpreter, a throw-away venv's or the test venv's, against the façade the E2B_* variables
name. It uses only calls every e2b 2.x has, so one flow covers 2.7 to the newest.

    python matrix_flow.py sandbox e2b                   # the e2b package's Sandbox
    python matrix_flow.py sandbox e2b_code_interpreter  # the same flow through its subclass
    python matrix_flow.py code e2b_code_interpreter     # run_code with a result

MATRIX_PROXY, when set, is given to the SDK as its `proxy=` (a TLS front standing in for an
operator's wildcard DNS and certificate). It prints "ok" when every step held; a failed step
raises, naming what it saw.
"""

from __future__ import annotations

import importlib
import os
import sys
import time
from datetime import UTC, datetime

import httpx
from e2b import CommandExitException, NotFoundException, PtySize

DIR = "/home/user/matrix"
OPTS = {"proxy": os.environ["MATRIX_PROXY"]} if "MATRIX_PROXY" in os.environ else {}


def sandbox_flow(sandbox_cls: type) -> None:
    sbx = sandbox_cls.create(template="base", timeout=120, metadata={"flow": "matrix"}, **OPTS)
    try:
        assert sbx.commands.run("echo $((6 * 7))").stdout == "42\n"
        seen: list[str] = []
        sbx.commands.run("echo out; echo err >&2", on_stdout=seen.append)
        assert "".join(seen) == "out\n", seen
        try:
            sbx.commands.run("echo bad >&2; exit 2")
        except CommandExitException as exc:
            assert (exc.exit_code, exc.stderr) == (2, "bad\n"), exc
        else:
            raise AssertionError("exit 2 raised no CommandExitException")

        fed = sbx.commands.run("read line; echo got $line", background=True, stdin=True)
        sbx.commands.send_stdin(fed.pid, "it\n")
        assert fed.wait().stdout == "got it\n"
        sleeper = sbx.commands.run("sleep 60", background=True)
        assert sleeper.pid in [p.pid for p in sbx.commands.list()]
        assert sbx.commands.kill(sleeper.pid)

        sbx.files.write(f"{DIR}/a.txt", "from the matrix")
        assert sbx.files.read(f"{DIR}/a.txt") == "from the matrix"
        assert [e.name for e in sbx.files.list(DIR)] == ["a.txt"]
        assert sbx.files.exists(f"{DIR}/a.txt")
        # Commands start in /home/user and see what the files API wrote there.
        assert sbx.commands.run("cat matrix/a.txt").stdout == "from the matrix"
        assert sbx.files.make_dir(f"{DIR}/sub")
        sbx.files.write(f"{DIR}/c.txt", b"\x00bytes")
        assert sbx.files.rename(f"{DIR}/c.txt", f"{DIR}/sub/c.txt").path == f"{DIR}/sub/c.txt"
        assert sbx.files.get_info(f"{DIR}/sub/c.txt").size == 6
        assert sbx.files.read(f"{DIR}/sub/c.txt", format="bytes") == b"\x00bytes"
        sbx.files.remove(f"{DIR}/sub")
        assert not sbx.files.exists(f"{DIR}/sub")
        # A signed URL, at the path the SDK builds (sandbox, path and operation in it).
        assert httpx.get(sbx.download_url(f"{DIR}/a.txt"), **OPTS).text == "from the matrix"

        seen_pty: list[bytes] = []
        terminal = sbx.pty.create(PtySize(rows=24, cols=80))
        sbx.pty.send_stdin(terminal.pid, b"echo pty$((1 + 1)); exit 0\n")
        terminal.wait(on_pty=seen_pty.append)
        assert b"pty2" in b"".join(seen_pty), seen_pty

        info = sbx.get_info()
        assert info.sandbox_id == sbx.sandbox_id
        assert info.metadata == {"flow": "matrix"}, info.metadata
        sbx.set_timeout(100)  # E2B counts it from the call, shorter or longer
        left = (sbx.get_info().end_at - datetime.now(UTC)).total_seconds()
        assert 90 < left <= 101, left

        # A second client of the same sandbox, as a process that only knows its id
        # (older SDKs send envd calls without E2b-Sandbox-Id after connect).
        late = sbx.commands.run("read go; echo late", background=True, stdin=True)
        other = sandbox_cls.connect(sbx.sandbox_id, **OPTS)
        assert other.commands.run("echo connected").stdout == "connected\n"
        assert other.files.read(f"{DIR}/a.txt") == "from the matrix"
        joined = other.commands.connect(late.pid)  # the first client's process
        other.commands.send_stdin(late.pid, "\n")
        assert joined.wait().stdout == "late\n"
        assert isinstance(sbx.get_metrics(), list)
    finally:
        sbx.kill()
    assert not sbx.is_running()
    try:
        sandbox_cls.connect(sbx.sandbox_id, **OPTS)
    except NotFoundException:
        pass
    else:
        raise AssertionError("connect to a killed sandbox succeeded")


def code_flow(sandbox_cls: type) -> None:
    sbx = sandbox_cls.create(template="base", timeout=120, **OPTS)
    try:
        execution = sbx.run_code("x = 6 * 7\nprint('hi')\nx")
        assert execution.error is None, execution.error
        assert execution.text == "42", execution.results
        assert "".join(execution.logs.stdout) == "hi\n", execution.logs
        assert sbx.run_code("x + 1").text == "43"  # state kept between runs
        failed = sbx.run_code("1 / 0")
        assert failed.error is not None and failed.error.name == "ZeroDivisionError"
    finally:
        sbx.kill()


FLOWS = {"sandbox": sandbox_flow, "code": code_flow}

if __name__ == "__main__":
    flow, package = sys.argv[1:3]
    started = time.monotonic()
    FLOWS[flow](importlib.import_module(package).Sandbox)
    print(f"ok {time.monotonic() - started:.1f}s")
