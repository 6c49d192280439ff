"""A node in the roster (SPEC §18): registered before it says it serves, heartbeating, out of
the roster after a clean stop, and unreachable by itself once killed."""

from __future__ import annotations

import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sandcell.store.nodes import HEARTBEAT_INTERVAL_S, LIVENESS_WINDOW_S

from .conftest import Cluster, RunningNode, exchange, start_node


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


@pytest.mark.slow
def test_a_stop_ends_open_tunnels_and_the_next_start_adopts_the_cell(
    tmp_path: Path, cluster: Cluster
) -> None:
    node = start_node(tmp_path, cluster)
    sandbox_id = node.create()["id"]
    node.created.clear()  # it stays running across the restart, as with `serve`
    try:
        raw = socket.create_connection(("127.0.0.1", node.port), timeout=10)
        with node.router_context().wrap_socket(raw, server_hostname="127.0.0.1") as tunnel:
            tunnel.sendall(f"CONNECT /cells/{sandbox_id} HTTP/1.1\r\n\r\n".encode())
            assert tunnel.recv(1024).startswith(b"HTTP/1.1 200 ")
            assert node.stop(signal.SIGTERM) == 0  # not held up by the tunnel left open
            assert tunnel.recv(1024) == b""  # which the node ended
        assert b"1 sandbox stays running for the next start to adopt" in node.log.read_bytes()

        again = start_node(tmp_path, cluster)
        try:
            assert b"1 live sandbox adopted" in again.log.read_bytes()
            got = exchange(again.router_context(), again.port, _exec_through(sandbox_id))
            assert b"HTTP/1.1 401 " in got  # through the relay to the adopted cell's daemon
            assert _entry(again)["live_cells"] == 1
        finally:
            assert again.stop(signal.SIGTERM) == 0
    finally:  # whatever failed above, the cell goes: a node adopts it and deletes it
        node.stop()
        start_node(tmp_path, cluster, extra=("--cleanup-on-exit",)).stop()


@pytest.mark.slow
def test_cleanup_on_exit_deletes_the_live_sandboxes_at_a_stop(
    tmp_path: Path, cluster: Cluster
) -> None:
    node = start_node(tmp_path, cluster, extra=("--cleanup-on-exit",))
    node.create()
    node.created.clear()  # left for the stop to delete
    assert node.stop(signal.SIGTERM) == 0
    assert b"deleted 1 sandbox (--cleanup-on-exit)" in node.log.read_bytes()
    assert not any((node.data_dir / "cells").iterdir())


def _exec_through(sandbox_id: str) -> bytes:
    body = b'{"command": "true"}'
    return (
        f"CONNECT /cells/{sandbox_id} HTTP/1.1\r\n\r\n"
        "POST /v1/exec HTTP/1.1\r\nhost: sandcell-daemon\r\nconnection: close\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode() + body
