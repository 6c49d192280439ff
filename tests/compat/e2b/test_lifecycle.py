"""E2B's lifecycle through the unmodified e2b SDK (SPEC §14.2, issue 27 items 1 and 2):
`lifecycle={"on_timeout": "pause", "auto_resume": ...}` becomes §13's `on_timeout` and
`auto_resume`; `set_timeout(t)` sets the end to now + t, shorter or longer; `connect` extends
a running sandbox's timeout."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import pytest
from e2b import Sandbox

from sdk.helpers import served
from support.server import SMALL_TEMPLATE, RunningServer


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


def _end(server: RunningServer, key: str, sandbox_id: str) -> float:
    record = _record(server, key, sandbox_id)
    return datetime.fromisoformat(record["expires_at"].replace("Z", "+00:00")).timestamp()


def _gone_or_paused(server: RunningServer, key: str, sandbox_id: str) -> str:
    with server.client(key) as c:
        answer = c.get(f"/v1/sandboxes/{sandbox_id}")
    if answer.status_code == 404:
        return "gone"
    state = answer.raise_for_status().json()["state"]
    return state if state in ("paused", "deleted") else ""


def _within(deadline_s: float, check: Callable[[], str]) -> str:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if found := check():
            return found
        time.sleep(0.25)
    return check()


def test_set_timeout_sets_the_end_from_now_shorter_or_longer(
    e2b_server: RunningServer, e2b_env: dict[str, str]
) -> None:
    key = e2b_env["E2B_API_KEY"]
    sbx = Sandbox.create(timeout=600)
    try:
        assert abs(_end(e2b_server, key, sbx.sandbox_id) - (time.time() + 600)) < 30
        sbx.set_timeout(1200)  # longer than the create's
        assert abs(_end(e2b_server, key, sbx.sandbox_id) - (time.time() + 1200)) < 30
        sbx.set_timeout(120)  # shorter
        assert abs(_end(e2b_server, key, sbx.sandbox_id) - (time.time() + 120)) < 30
        info = sbx.get_info()
        assert abs(info.end_at.timestamp() - (time.time() + 120)) < 30
    finally:
        sbx.kill()


def test_set_timeout_5_ends_the_sandbox_soon_after(
    e2b_server: RunningServer, e2b_env: dict[str, str]
) -> None:
    key = e2b_env["E2B_API_KEY"]
    sbx = Sandbox.create(timeout=300)
    kept = Sandbox.create(timeout=300, lifecycle={"on_timeout": "pause"})
    try:
        started = time.monotonic()
        sbx.set_timeout(5)
        kept.files.write("/home/user/kept.txt", "still here")
        kept.set_timeout(5)
        # The reaper's pass runs at the end set (not up to its 5 s interval later), so the
        # sandbox is gone soon after 5 s, as on E2B, not still running at 6 or 10.
        assert _within(20, lambda: _gone_or_paused(e2b_server, key, sbx.sandbox_id)) in (
            "gone",
            "deleted",
        )
        assert 4 <= time.monotonic() - started < 8
        assert _within(20, lambda: _gone_or_paused(e2b_server, key, kept.sandbox_id)) == "paused"
        resumed = Sandbox.connect(kept.sandbox_id)
        assert resumed.files.read("/home/user/kept.txt") == "still here"
    finally:
        sbx.kill()
        kept.kill()


def test_set_timeout_0_times_out_now(e2b_server: RunningServer, e2b_env: dict[str, str]) -> None:
    """E2B's own tests force an auto-pause with set_timeout(0)."""
    key = e2b_env["E2B_API_KEY"]
    sbx = Sandbox.create(timeout=300, lifecycle={"on_timeout": "pause"})
    try:
        started = time.monotonic()
        sbx.set_timeout(0)
        assert _within(20, lambda: _gone_or_paused(e2b_server, key, sbx.sandbox_id)) == "paused"
        assert time.monotonic() - started < 5 and not sbx.is_running()
    finally:
        sbx.kill()


def test_connect_while_the_timeouts_pause_runs_resumes() -> None:
    """E2B's tests connect as soon as `is_running()` is false, while the pause may still be
    under way: the connect waits for it, then resumes."""
    sbx = Sandbox.create(timeout=300, lifecycle={"on_timeout": "pause"})
    try:
        sbx.files.write("/home/user/kept.txt", "kept")
        sbx.set_timeout(0)
        deadline = time.monotonic() + 20
        while sbx.is_running() and time.monotonic() < deadline:
            time.sleep(0.05)
        resumed = sbx.connect()
        assert resumed.is_running() and resumed.files.read("/home/user/kept.txt") == "kept"
    finally:
        sbx.kill()


@pytest.fixture(scope="module")
def slow_reaper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """A server whose reaper's regular pass is a minute apart: an end kept on time here was
    kept by the pass run at that end, not by a tick that happened to fall near it."""
    config = "[server]\nreap_interval_s = 60\n" + SMALL_TEMPLATE.format(warm_pool=0)
    yield from served(tmp_path_factory.mktemp("slow-reaper"), config_text=config)


def test_timeouts_end_the_sandbox_on_time(slow_reaper: RunningServer) -> None:
    # E2B's own lifecycle tests create with timeout=3, or set_timeout, and look a few
    # seconds later.
    key = slow_reaper.create_key("e2b-ends")
    url = f"{slow_reaper.url}/e2b"
    opts: dict[str, Any] = {"api_key": key, "api_url": url, "sandbox_url": url}
    started = time.monotonic()
    ended = Sandbox.create(timeout=3, **opts)
    paused = Sandbox.create(timeout=3, lifecycle={"on_timeout": "pause"}, **opts)
    shortened = Sandbox.create(timeout=300, **opts)
    shortened.set_timeout(4)
    try:
        state = {
            i: _within(20, lambda i=i: _gone_or_paused(slow_reaper, key, i))
            for i in (ended.sandbox_id, shortened.sandbox_id, paused.sandbox_id)
        }
        assert state[ended.sandbox_id] in ("gone", "deleted")
        assert state[shortened.sandbox_id] in ("gone", "deleted")
        assert state[paused.sandbox_id] == "paused"
        assert 2.5 <= time.monotonic() - started < 10
    finally:
        for sbx in (ended, paused, shortened):
            sbx.kill()


def test_a_short_v1_idle_timeout_ends_on_time(slow_reaper: RunningServer) -> None:
    # Alone on its server: no other sandbox's end brings a pass near its own.
    key = slow_reaper.create_key("v1-idle")
    started = time.monotonic()
    with slow_reaper.client(key) as c:
        idle = c.post("/v1/sandboxes", json={"idle_timeout_s": 3}).raise_for_status().json()
    assert _within(20, lambda: _gone_or_paused(slow_reaper, key, idle["id"])) in (
        "gone",
        "deleted",
    )
    assert 2.5 <= time.monotonic() - started < 10


def test_connect_extends_a_running_sandboxs_timeout(
    e2b_server: RunningServer, e2b_env: dict[str, str]
) -> None:
    key = e2b_env["E2B_API_KEY"]
    sbx = Sandbox.create(timeout=60)
    try:
        Sandbox.connect(sbx.sandbox_id, timeout=900)
        assert abs(_end(e2b_server, key, sbx.sandbox_id) - (time.time() + 900)) < 30
        Sandbox.connect(sbx.sandbox_id, timeout=120)  # shorter: the later end is kept
        assert abs(_end(e2b_server, key, sbx.sandbox_id) - (time.time() + 900)) < 30
    finally:
        sbx.kill()
