"""A node in the roster (SPEC §18): registered before it says it serves, heartbeating, out of
the roster after a clean stop, and unreachable by itself once killed."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sandcell.store.nodes import HEARTBEAT_INTERVAL_S, LIVENESS_WINDOW_S

from .conftest import Cluster, RunningNode, start_node


def _entry(node: RunningNode) -> dict | None:
    return next((n for n in node.roster() if n["name"] == "node-a"), None)


def _poll(check: Callable[[], dict | bool | None], within_s: float, what: str) -> dict:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if found := check():
            return found
        time.sleep(0.2)
    raise AssertionError(f"not within {within_s:.0f} s: {what}")


@pytest.mark.slow
def test_a_node_heartbeats_and_leaves_the_roster_at_a_clean_stop(
    tmp_path: Path, cluster: Cluster
) -> None:
    node = start_node(tmp_path, cluster)
    try:
        first = _entry(node)  # registered before it says it serves
        assert first is not None
        assert first["address"] == node.address
        assert first["liveness"] == "live"
        assert first["state"] == "active"
        assert first["labels"] == {"zone": "test"}
        assert (first["cells"], first["live_cells"]) == (8, 0)
        assert first["memory_mb"] > 0 and first["cpus"] > 0 and first["disk_mb"] > 0
        later = _poll(
            lambda: (e := _entry(node)) and e["heartbeat_at"] > first["heartbeat_at"] and e,
            HEARTBEAT_INTERVAL_S * 3,
            "a second heartbeat",
        )
        assert later is not None and later["liveness"] == "live"
    finally:
        assert node.stop(signal.SIGTERM) == 0
    assert _entry(node) is None
    assert b"node node-a stopped" in node.log.read_bytes()


@pytest.mark.slow
def test_a_killed_node_turns_unreachable_within_the_heartbeat_window(
    tmp_path: Path, cluster: Cluster
) -> None:
    node = start_node(tmp_path, cluster)
    node.proc.kill()  # no goodbye: it stays in the roster
    node.proc.wait()
    killed_at = time.monotonic()
    gone = _poll(
        lambda: (e := _entry(node)) and e["liveness"] == "unreachable" and e,
        LIVENESS_WINDOW_S + HEARTBEAT_INTERVAL_S * 2,
        "the killed node reported unreachable",
    )
    assert gone is not None
    assert time.monotonic() - killed_at >= LIVENESS_WINDOW_S - HEARTBEAT_INTERVAL_S
