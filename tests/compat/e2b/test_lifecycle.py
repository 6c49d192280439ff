"""E2B's lifecycle through the unmodified e2b SDK (SPEC §14.2, issue 27 items 1 and 2):
`lifecycle={"on_timeout": "pause", "auto_resume": ...}` becomes §13's `on_timeout` and
`auto_resume`; `set_timeout(t)` sets the end to now + t, shorter or longer; `connect` extends
a running sandbox's timeout."""

from __future__ import annotations

from typing import Any

from e2b import Sandbox

from support.server import RunningServer


def _record(server: RunningServer, key: str, sandbox_id: str) -> dict[str, Any]:
    with server.client(key) as c:
        return c.get(f"/v1/sandboxes/{sandbox_id}").raise_for_status().json()


def test_lifecycle_pause_and_auto_resume_take_effect(
    e2b_server: RunningServer, e2b_env: dict[str, str]
) -> None:
    key = e2b_env["E2B_API_KEY"]
    paused = Sandbox.create(lifecycle={"on_timeout": "pause", "auto_resume": True})
    plain = Sandbox.create(lifecycle={"on_timeout": "pause"})
    killed = Sandbox.create()
    try:
        record = _record(e2b_server, key, paused.sandbox_id)
        assert (record["on_timeout"], record["auto_resume"]) == ("pause", True)
        record = _record(e2b_server, key, plain.sandbox_id)
        assert (record["on_timeout"], record["auto_resume"]) == ("pause", False)
        assert _record(e2b_server, key, killed.sandbox_id)["on_timeout"] == "delete"
    finally:
        for sbx in (paused, plain, killed):
            sbx.kill()
