"""`sandcell pause|resume|snapshot|fork ID` and `sandcell snapshots ls|rm`, as a user runs
them against a real server."""

from __future__ import annotations

import json
import subprocess

import pytest

from support.server import sandcell_bin

pytestmark = pytest.mark.slow


def sandcell(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sandcell_bin(), *args], env=env, capture_output=True, text=True, timeout=60
    )


def _ok(env: dict[str, str], *args: str) -> str:
    done = sandcell(env, *args)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_pause_resume_snapshot_fork_and_snapshots(env: dict[str, str]):
    sid = _ok(env, "create")
    _ok(env, "exec", sid, "--", "sh", "-c", "echo v1 > a.txt")
    assert _ok(env, "pause", sid) == "paused"
    assert _ok(env, "pause", sid) == "paused"  # idempotent
    assert _ok(env, "resume", sid) == "running"
    snap = _ok(env, "snapshot", sid, "--name", "first")
    assert snap.startswith("snap-")
    _ok(env, "exec", sid, "--", "sh", "-c", "echo v2 > a.txt")
    child = _ok(env, "create", "--snapshot", snap)
    assert _ok(env, "exec", child, "--", "cat", "a.txt") == "v1"
    forked = _ok(env, "fork", sid)
    assert _ok(env, "exec", forked, "--", "cat", "a.txt") == "v2"
    assert snap in _ok(env, "snapshots", "ls")
    listed = json.loads(_ok(env, "snapshots", "ls", "--json"))
    assert [s["name"] for s in listed if s["id"] == snap] == ["first"]
    _ok(env, "snapshots", "rm", snap)
    gone = sandcell(env, "snapshots", "rm", snap)
    assert gone.returncode == 1 and "Traceback" not in gone.stderr
    missing = sandcell(env, "resume", "sbx-0000000000000000")
    assert missing.returncode != 0 and "SANDBOX_NOT_FOUND" in missing.stderr
    _ok(env, "rm", sid, child, forked)
