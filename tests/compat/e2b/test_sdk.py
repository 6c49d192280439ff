"""The unmodified `e2b` SDK against a real sandcell serve, through the /e2b façade."""

from __future__ import annotations

import httpx
import pytest
from e2b import Sandbox
from e2b.exceptions import AuthenticationException, NotFoundException, SandboxException
from e2b.sandbox.commands.command_handle import CommandExitException

from support.server import RunningServer

pytestmark = pytest.mark.slow


def test_create_run_files_kill() -> None:
    sbx = Sandbox.create(timeout=120)
    try:
        result = sbx.commands.run("echo hello; echo oops >&2")
        assert result.exit_code == 0
        assert result.stdout == "hello\n"
        assert result.stderr == "oops\n"
        sbx.files.write("/home/user/notes/a.txt", "some text")
        assert sbx.files.read("notes/a.txt") == "some text"
        assert sbx.files.exists("/home/user/notes/a.txt")
        assert [e.name for e in sbx.files.list("/home/user/notes")] == ["a.txt"]
        with pytest.raises(CommandExitException) as caught:
            sbx.commands.run("exit 3")
        assert caught.value.exit_code == 3
        assert sbx.is_running()
    finally:
        assert sbx.kill()
    assert not sbx.is_running()
    with pytest.raises(SandboxException, match="was not found"):
        sbx.files.read("notes/a.txt")
    with pytest.raises(SandboxException, match="was not found"):
        sbx.commands.run("true")


def test_key_in_e2b_hex_form(e2b_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Some e2b versions accept only `e2b_<hex>` keys: a sandcell key hex-encoded passes."""
    monkeypatch.setenv("E2B_API_KEY", "e2b_" + e2b_env["E2B_API_KEY"].encode().hex())
    sbx = Sandbox.create()
    assert sbx.kill()


def test_wrong_key_is_an_authentication_error(monkeypatch: pytest.MonkeyPatch) -> None:
    for wrong in ("sk-not-a-sandcell-key", "e2b_" + b"sc_guess".hex(), "e2b_ff"):
        monkeypatch.setenv("E2B_API_KEY", wrong)
        with pytest.raises(AuthenticationException):
            Sandbox.create()


def test_another_principals_sandbox_is_not_found(
    e2b_server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    sbx = Sandbox.create()
    try:
        monkeypatch.setenv("E2B_API_KEY", e2b_server.create_key("e2b-intruder"))
        with pytest.raises(NotFoundException):
            Sandbox.connect(sbx.sandbox_id)
        assert Sandbox.kill(sbx.sandbox_id) is False  # E2B's answer for "no such sandbox"
        with pytest.raises(NotFoundException):
            Sandbox.get_info(sbx.sandbox_id)
        assert sbx.sandbox_id not in [s.sandbox_id for s in Sandbox.list().next_items()]
        assert sbx.commands.run("echo still here").stdout == "still here\n"
    finally:
        sbx.kill()


def test_envd_needs_the_sandboxs_own_access_token(e2b_server: RunningServer) -> None:
    """The in-sandbox API refuses a missing token, a wrong one and another sandbox's."""
    first, second = Sandbox.create(), Sandbox.create()
    try:
        stat = f"{e2b_server.url}/e2b/filesystem.Filesystem/Stat"
        attempts = [None, "wrong", second._envd_access_token]
        for token in attempts:
            headers = {"E2b-Sandbox-Id": first.sandbox_id, "E2b-Sandbox-Port": "49983"}
            if token is not None:
                headers["X-Access-Token"] = token
            answer = httpx.post(stat, json={"path": "/home/user"}, headers=headers)
            assert answer.status_code == 401
            assert answer.json()["code"] == "unauthenticated"
    finally:
        first.kill()
        second.kill()
