"""Listening sockets made inside another network namespace by the host (needs root)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from sandcell.network import bridge
from support.server import free_port

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="entering a namespace needs root")


# Brings the namespace's loopback up (SIOCSIFFLAGS, IFF_UP), as bwrap does for a cell, then waits.
LO_UP_AND_WAIT = (
    "import fcntl, socket, struct, time\n"
    "fcntl.ioctl(socket.socket(), 0x8914, struct.pack('16sh', b'lo', 1))\n"
    "print('up', flush=True)\n"
    "time.sleep(60)"
)


@pytest.fixture
def netns_pid() -> Iterator[int]:
    """A process alone in a fresh network namespace (loopback only)."""
    argv = ["unshare", "--net", "--", sys.executable, "-c", LO_UP_AND_WAIT]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "up\n"
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def test_a_listener_in_another_namespace_is_reached_only_from_there(netns_pid):
    port = free_port()
    (listener,) = bridge.listen_in(netns_pid, ports=(port,))
    try:
        with pytest.raises(ConnectionRefusedError):  # not on the host's loopback
            socket.create_connection(("127.0.0.1", port), timeout=2)
        inside = subprocess.Popen(
            [
                "nsenter",
                f"--net=/proc/{netns_pid}/ns/net",
                "--",
                sys.executable,
                "-c",
                f"import socket; socket.create_connection(('127.0.0.1', {port})).sendall(b'hi')",
            ],
        )
        listener.settimeout(5)
        conn, _ = listener.accept()
        assert conn.recv(2) == b"hi"
        conn.close()
        assert inside.wait(10) == 0
        assert bridge.netns_of("thread-self") == bridge.netns_of("self")  # we are back home
    finally:
        listener.close()


def test_a_taken_port_or_a_missing_process_is_a_bridge_error(netns_pid):
    port = free_port()
    (first,) = bridge.listen_in(netns_pid, ports=(port,))
    try:
        with pytest.raises(bridge.BridgeError, match="in use"):
            bridge.listen_in(netns_pid, ports=(port,))
    finally:
        first.close()
    with pytest.raises(bridge.BridgeError):
        bridge.listen_in(999_999_999)
    with pytest.raises(bridge.BridgeError):
        bridge.cell_pid(123_456_789)
