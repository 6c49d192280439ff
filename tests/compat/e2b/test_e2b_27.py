"""The oldest e2b the façade promises (2.7): installed in a throw-away venv of its own, since
one venv holds one e2b, and run against the same server as the newest one."""

from __future__ import annotations

from pathlib import Path

import pytest

from compat.e2b.venvs import run_in_venv

pytestmark = pytest.mark.slow
E2B_27 = "e2b==2.7.0"
SCRIPT = """
from e2b import Sandbox
from e2b.exceptions import NotFoundException
from e2b.sandbox.commands.command_handle import CommandExitException

sbx = Sandbox.create(timeout=120)
try:
    assert sbx.commands.run("echo $((6 * 7))").stdout == "42\\n"
    sbx.files.write("/home/user/a/b.txt", "old sdk")
    assert sbx.files.read("/home/user/a/b.txt") == "old sdk"
    assert [e.name for e in sbx.files.list("/home/user/a")] == ["b.txt"]
    handle = sbx.commands.run("read line; echo got $line", background=True, stdin=True)
    sbx.commands.send_stdin(handle.pid, "it\\n")
    assert handle.wait().stdout == "got it\\n"
    try:
        sbx.commands.run("exit 2")
    except CommandExitException as exc:
        assert exc.exit_code == 2
    else:
        raise AssertionError("no CommandExitException")
    sbx.set_timeout(100)
    assert sbx.get_info().sandbox_id == sbx.sandbox_id
finally:
    sbx.kill()
try:
    Sandbox.connect(sbx.sandbox_id)
except NotFoundException:
    print("ok")
"""


@pytest.mark.timeout(900)
def test_e2b_2_7(tmp_path: Path, e2b_env: dict[str, str]) -> None:
    done = run_in_venv(tmp_path / "venv", [E2B_27], SCRIPT, e2b_env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
