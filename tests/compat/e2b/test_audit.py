"""The audit trail through E2B's façade (SPEC §20), driven by the unmodified e2b SDK: its
control calls name the key's principal and key; its envd calls, made with the sandbox's access
token, name the sandbox's owner; a file's contents never reach a record."""

from __future__ import annotations

from e2b import Sandbox

from support.server import RunningServer

CONTENT = "contents the trail never keeps 51b7"


def test_the_sdks_actions_are_recorded(e2b_server: RunningServer, e2b_env: dict[str, str]):
    sbx = Sandbox.create(timeout=120)
    try:
        assert sbx.commands.run("echo via-e2b").stdout == "via-e2b\n"
        sbx.files.write("/home/user/note.txt", CONTENT)
        assert sbx.files.read("/home/user/note.txt") == CONTENT
        sbx.files.remove("/home/user/note.txt")
        sbx.set_timeout(100)
    finally:
        sbx.kill()
    with e2b_server.client(e2b_env["E2B_API_KEY"]) as http:
        records = http.get("/v1/audit", params={"sandbox": sbx.sandbox_id}).json()["records"]
    actions = [r["action"] for r in records]
    for action in ("sandbox.create", "file.write", "file.read", "file.remove", "sandbox.delete"):
        assert action in actions, actions
    assert "process.start" in actions or "exec" in actions, actions
    assert "sandbox.timeout" in actions, actions
    assert {r["principal"] for r in records} == {"e2b-user"}
    control = {r["key_name"] for r in records if r["action"].startswith("sandbox.")}
    assert control == {"e2b-user"}
    written = next(r for r in records if r["action"] == "file.write")
    assert written["touched"]["path"].endswith("note.txt")
    assert all(CONTENT not in str(r) for r in records)
