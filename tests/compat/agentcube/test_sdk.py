"""The unmodified agentcube SDK against a real `sandcell serve` and real cells."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import requests
from agentcube.exceptions import CommandExecutionError

from support.server import RunningServer

pytestmark = pytest.mark.slow


def sandbox_of(session_id: str) -> str:
    return session_id.split(".", 1)[0]


def test_a_session_end_to_end(interpreter, server: RunningServer, api_key: str, tmp_path: Path):
    with interpreter() as ci:
        sandbox_id = sandbox_of(ci.session_id)
        with server.client(api_key) as http:
            sandbox = http.get(f"/v1/sandboxes/{sandbox_id}").raise_for_status().json()
        assert sandbox["template"] == "default"
        assert sandbox["metadata"]["agentcube.namespace"] == "team-a"
        assert ci.execute_command("echo hi there") == "hi there\n"
        assert ci.run_code("python", "print(6 * 7)") == "42\n"
        assert ci.run_code("bash", "echo $((1 + 2)) && pwd").startswith("3\n")
        ci.write_file("hello", "data/a.txt")
        assert ci.execute_command("cat data/a.txt") == "hello"
        names = {f["name"]: f for f in ci.list_files("data")}
        assert names["a.txt"]["size"] == 5 and names["a.txt"]["is_dir"] is False
        assert names["a.txt"]["mode"] == "-rw-r--r--"
        payload = os.urandom(300_000)  # binary, and past the daemon's streaming threshold
        (tmp_path / "in.bin").write_bytes(payload)
        ci.upload_file(str(tmp_path / "in.bin"), "up/in.bin")
        ci.download_file("up/in.bin", str(tmp_path / "out" / "copy.bin"))
        assert (tmp_path / "out" / "copy.bin").read_bytes() == payload
        with pytest.raises(CommandExecutionError) as failed:
            ci.execute_command("ls /no/such/dir")
        assert failed.value.exit_code == 2 and "No such file" in failed.value.stderr
    with server.client(api_key) as http:  # stop() deleted the sandbox
        assert http.get(f"/v1/sandboxes/{sandbox_id}").status_code == 404
        # SPEC §20: each action through the façade is in the trail, without the payload
        trail = http.get("/v1/audit", params={"sandbox": sandbox_id}).json()["records"]
    actions = {r["action"] for r in trail}
    assert {"sandbox.create", "exec", "file.write", "file.read", "sandbox.delete"} <= actions
    assert {r["principal"] for r in trail} == {"agentcube-user"}
    # the session's calls carry its id, not the key: they name the owner and no key
    assert {r["key_name"] for r in trail if r["action"] == "sandbox.create"} == {"agentcube-user"}
    assert "echo hi there" not in str(trail)  # a command's length and digest only


def test_a_session_is_reused_by_id(interpreter):
    first = interpreter()
    try:
        first.write_file("42", "value.txt")
        second = interpreter(session_id=first.session_id)
        assert second.run_code("python", "print(open('value.txt').read())") == "42\n"
    finally:
        first.stop()


def test_timeout_is_picods_exit_124(interpreter):
    with interpreter() as ci:
        with pytest.raises(CommandExecutionError) as timed_out:
            ci.execute_command("sleep 30", timeout=1)
        assert timed_out.value.exit_code == 124
        assert "timed out after 1 seconds" in timed_out.value.stderr
        assert ci.execute_command("echo alive") == "alive\n"


def test_wrong_key_is_refused(interpreter):
    with pytest.raises(requests.HTTPError) as refused:
        interpreter(auth_token="sc_not-a-key")
    assert refused.value.response.status_code == 401
    assert refused.value.response.json()["error"]["code"] == "UNAUTHENTICATED"


def test_escaping_the_workspace_is_refused(interpreter):
    with interpreter() as ci:
        with pytest.raises(requests.HTTPError) as refused:
            ci.write_file("x", "../../etc/evil")
        assert refused.value.response.status_code == 403
        with pytest.raises(requests.HTTPError):
            ci.download_file("../../../etc/passwd", "/dev/null")
