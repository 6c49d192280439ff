"""Cell host uids: claimed host-wide, and the handle that kills a cell when nothing else can.

Every cell runs as a host uid of its own (SPEC §3: never 0 on the host). The uid is unique on
the host whichever sandcell made the cell (a server, another replica, a test session beside
it): claims are files in a registry under /run naming the claiming cell's directory.

Because the uid is the cell's alone, "every process of this uid" is exactly "every process of
this cell", whatever it did: double-forked, setsid, left the cgroup hierarchy, or was started
by a manager that has since restarted. That makes the uid the last-resort kill switch of a cell
made without a cgroup (the layer degraded), and of any cell another LocalCells made.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

UID_REGISTRY = Path("/run/sandcell-uids")
DEFAULT_UID_BASE = 200_000
DEFAULT_UID_COUNT = 10_000
KILL_TIMEOUT_S = 5.0
_POLL_S = 0.005
log = logging.getLogger("sandcell.isolation.uids")


class NoFreeUid(Exception):
    """Every uid of the configured range is claimed or still runs something."""


def claim(cell_dir: Path, base: int, count: int) -> int:
    """A host uid no other cell on this host holds, whichever sandcell made it: a claim
    whose directory is gone (a crash, a destroyed cell) is free again. A uid that some
    process still runs as is never handed out, claim or not: a cell whose directory was
    removed from under it may still run, and a new tenant must not share its uid."""
    UID_REGISTRY.mkdir(mode=0o700, parents=True, exist_ok=True)
    for uid in range(base, base + count):
        path = UID_REGISTRY / str(uid)
        for _ in range(2):
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                if not _stale_claim(path):
                    break
                path.unlink(missing_ok=True)
                continue
            with os.fdopen(fd, "w") as f:
                f.write(str(cell_dir))
            if not runs_as(uid):
                return uid
            log.warning("cell uid %d skipped: processes still run as it, of no cell", uid)
            path.unlink(missing_ok=True)
            break
    raise NoFreeUid("no free cell uid left in the configured range")


def release(uid: int, cell_dir: Path) -> None:
    """Gives `uid` back, if `cell_dir` still holds it (a stale claim may be another's now)."""
    with contextlib.suppress(OSError):
        path = UID_REGISTRY / str(uid)
        if path.read_text() == str(cell_dir):
            path.unlink()


def claimed_by(cell_dir: Path) -> int | None:
    """The uid `cell_dir` claims: for a cell whose record was never written (a crash
    mid-create), which may nevertheless run processes."""
    try:
        claims = [c for c in UID_REGISTRY.iterdir() if c.name.isdigit()]
    except OSError:
        return None
    for path in claims:
        with contextlib.suppress(OSError):
            if path.read_text() == str(cell_dir):
                return int(path.name)
    return None


def processes_of(uid: int) -> list[int]:
    """Live processes whose real, effective or saved uid is `uid` (from `status`: a
    non-dumpable process's /proc entry is root's, whoever runs it; ~9 ms per 100 processes
    on a busy host). A zombie does not count: it runs nothing, and its parent may take its
    time to reap it."""
    return list(_scan(uid))


def runs_as(uid: int) -> bool:
    return next(_scan(uid), None) is not None


def _scan(uid: int) -> Iterator[int]:
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                running = _runs(entry.path, uid)
            except (OSError, ValueError, IndexError):
                continue  # exited meanwhile
            if running:
                yield int(entry.name)


def kill_all(uid: int, timeout_s: float = KILL_TIMEOUT_S) -> list[int]:
    """SIGKILLs every process of `uid` until none is left; returns those still alive at the
    deadline (empty: all gone). PID namespace inits go first: the kernel then kills their
    whole namespace at once, forks in flight included, so a fork loop cannot outrun the
    sweep. Each signal goes through a pidfd taken before the uid is checked, so a pid that
    is reused meanwhile is never signalled."""
    deadline = time.monotonic() + timeout_s
    while pids := processes_of(uid):
        for pid in sorted(pids, key=lambda p: not _namespace_init(p)):
            _kill_if_runs(pid, uid)
        if time.monotonic() > deadline:
            return processes_of(uid)
        time.sleep(_POLL_S)
    return []


def _kill_if_runs(pid: int, uid: int) -> None:
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return  # gone
    try:
        if _runs(f"/proc/{pid}", uid):  # the pidfd's process, if it is still alive
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except (OSError, ValueError, IndexError):
        pass  # exited meanwhile
    finally:
        os.close(pidfd)


def _field(status: bytes, name: bytes) -> list[bytes]:
    """The values of one line of /proc/PID/status (read whole: ~2 KiB)."""
    start = status.index(b"\n" + name + b":") + len(name) + 2
    return status[start : status.index(b"\n", start)].split()


def _status(proc: str) -> bytes:
    with open(f"{proc}/status", "rb") as f:
        return f.read()


def _runs(proc: str, uid: int) -> bool:
    status = _status(proc)
    return _field(status, b"State")[0] != b"Z" and str(uid).encode() in _field(status, b"Uid")[:3]


def _namespace_init(pid: int) -> bool:
    """Whether `pid` is pid 1 of a PID namespace below ours (NSpid: its pid at each level)."""
    try:
        nspid = _field(_status(f"/proc/{pid}"), b"NSpid")
    except (OSError, ValueError):
        return False
    return len(nspid) > 1 and nspid[-1] == b"1"


def _stale_claim(path: Path) -> bool:
    try:
        return not Path(path.read_text()).is_dir()
    except OSError:
        return False  # being written right now, or unreadable: not ours to take
