"""Listening sockets created inside a cell's network namespace by the host, with no process of
the cell's help.

A short-lived thread enters the cell's namespace (`setns` is per thread), binds and listens on
the cell's loopback, and dies; the sockets stay in the cell's namespace while the host's event
loop accepts on them. The cell cannot replace them (they are bound before its code runs) and
nothing in the cell relays: the kernel's loopback hands each connection to the host process.
Needs root (CAP_SYS_ADMIN over the cell's user namespace).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import socket
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

CLONE_NEWNET = 0x40000000
HTTP_PORT, SOCKS_PORT = 3128, 1080
BACKLOG = 128
_libc = ctypes.CDLL(None, use_errno=True)


class BridgeError(Exception):
    """The cell's namespace could not be found or entered."""


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def netns_of(pid: int | str) -> int:
    return os.stat(f"/proc/{pid}/ns/net").st_ino


def cell_pid(uid: int) -> int:
    """A process of the cell whose host uid is `uid` that sits in the cell's network namespace
    (bwrap's own first process stays in the host's; its child is inside). Cell uids are unique
    host-wide, and cells cannot make namespaces of their own (seccomp), so any such process
    is in the cell's one network namespace."""
    host = netns_of("self")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if _real_uid(entry) == uid and netns_of(entry.name) != host:
                return int(entry.name)
        except (OSError, ValueError):
            continue  # exited meanwhile
    raise BridgeError(f"no process of cell uid {uid} in a network namespace of its own")


def _real_uid(proc: Path) -> int:
    """From `status`: the owner of /proc/PID is root for non-dumpable processes."""
    for line in (proc / "status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise ValueError("no Uid line")


def listen_in(pid: int, ports: Sequence[int] = (HTTP_PORT, SOCKS_PORT)) -> list[socket.socket]:
    """Listening sockets on 127.0.0.1:`port` in the network namespace of `pid`."""
    result: list[socket.socket] = []
    failure: list[BaseException] = []

    def inside() -> None:
        try:
            with (
                _opened("/proc/thread-self/ns/net") as own,
                _opened(f"/proc/{pid}/ns/net") as target,
            ):
                _setns(target)
                try:
                    result.extend(_listen(port) for port in ports)
                finally:
                    _setns(own)  # if this failed the thread would still die right after
        except BaseException as exc:
            failure.append(exc)
            for sock in result:
                sock.close()

    thread = threading.Thread(target=inside, name=f"sandcell-netns-{pid}")
    thread.start()
    thread.join()
    if failure:
        raise BridgeError(f"cannot listen in the network namespace of {pid}: {failure[0]}")
    return result


@contextlib.contextmanager
def _opened(path: str) -> Iterator[int]:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        yield fd
    finally:
        os.close(fd)


def _listen(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock
