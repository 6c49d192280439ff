"""The session-wide leak check: nothing of sandcell that a test session made may outlive it.

`HostSnapshot.take()` at session start, `assert_nothing_leaked(before, basetemp)` at its end.
What counts as a leak, when it was not there at the start:

* a live (non-zombie) process of a cell: `sandcell.daemon` or `bwrap` in its command line, run
  by a cell uid (200000-209999);
* any live process whose command line names the session's temporary directory (a `sandcell
  serve`, a bare daemon, a Redis server that a test started and did not stop);
* a cgroup of a cell (`<...>/sandcell*/cell-*`) or a test parent (`<...>/sandcell-test-*`) in
  any hierarchy under /sys/fs/cgroup;
* a loop mount of a cell's workspace (`*/cells/*/workspace` in /proc/mounts);
* a listening unix socket under the session's temporary directory;
* a cell directory left in a `cells` directory under the session's temporary directory.

The host may run other sandcell instances at the same time (a developer's server, another
session's suite): a cell whose workspace is mounted from a `cells` directory that existed before
this session, or from another pytest session's temporary directory, is theirs, and is ignored
along with its cgroups and processes.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

CELL_UIDS = range(200_000, 210_000)
CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_MAX_DEPTH = 8
_CELL_ID = re.compile(r"^c[0-9a-z-]{1,63}$")
_PYTEST_BASETEMP = re.compile(r"/pytest-of-[^/]+/pytest-\d+(?=/)")
_WORKSPACE_MOUNT = re.compile(r"^(?P<cells>.*/cells)/(?P<cell>[^/]+)/workspace$")


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), field)


@dataclass(frozen=True)
class Process:
    pid: int
    start: int  # clock ticks since boot: (pid, start) names a process despite pid reuse
    uid: int
    cmdline: str
    cgroup_cell: str | None  # the cell id, when the process is in a cell's cgroup

    @property
    def key(self) -> tuple[int, int]:
        return (self.pid, self.start)


def live_processes() -> Iterator[Process]:
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        stat = _read(f"/proc/{pid}/stat")
        tail = stat[stat.rfind(b")") + 2 :].split()
        if not tail or tail[0] == b"Z":  # gone, or a zombie: pid 1 here reaps lazily
            continue
        uid = -1
        for line in _read(f"/proc/{pid}/status").splitlines():
            if line.startswith(b"Uid:"):
                uid = int(line.split()[1])
                break
        cmdline = _read(f"/proc/{pid}/cmdline").replace(b"\0", b" ").decode(errors="replace")
        cell = None
        for line in _read(f"/proc/{pid}/cgroup").decode(errors="replace").splitlines():
            match = re.search(r"/sandcell[^/]*/cell-([^/]+)", line)
            if match:
                cell = match[1]
                break
        yield Process(pid, int(tail[19]), uid, cmdline.strip(), cell)


def is_cell_process(p: Process) -> bool:
    return p.uid in CELL_UIDS and ("sandcell.daemon" in p.cmdline or "bwrap" in p.cmdline)


def sandcell_cgroups() -> set[str]:
    """Cell cgroups (`*/sandcell*/cell-*`) and test parents (`*/sandcell-test-*`)."""
    found: set[str] = set()

    def walk(directory: str, depth: int) -> None:
        try:
            children = [e for e in os.scandir(directory) if e.is_dir(follow_symlinks=False)]
        except OSError:
            return
        for child in children:
            if child.name.startswith("sandcell"):
                if child.name.startswith("sandcell-test-"):
                    found.add(child.path)
                try:
                    cells = [e for e in os.scandir(child.path) if e.is_dir(follow_symlinks=False)]
                except OSError:
                    cells = []
                found.update(e.path for e in cells if e.name.startswith("cell-"))
            elif depth < CGROUP_MAX_DEPTH:
                walk(child.path, depth + 1)

    walk(str(CGROUP_ROOT), 0)
    return found


def workspace_mounts() -> dict[str, str]:
    """Mount point -> cell id, for every mounted cell workspace."""
    found = {}
    for line in _read("/proc/mounts").decode(errors="replace").splitlines():
        fields = line.split()
        if len(fields) < 2:
            continue
        match = _WORKSPACE_MOUNT.match(_unescape(fields[1]))
        if match:
            found[match.string] = match["cell"]
    return found


def listening_unix_sockets() -> set[str]:
    paths = set()
    for line in _read("/proc/net/unix").decode(errors="replace").splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 8 and fields[7].startswith("/"):
            paths.add(fields[7])
    return paths


@dataclass(frozen=True)
class HostSnapshot:
    processes: frozenset[tuple[int, int]]
    cgroups: frozenset[str]
    mounts: frozenset[str]
    cells_dirs: frozenset[str]  # `cells` directories in use before the session: not ours
    sockets: frozenset[str]

    @classmethod
    def take(cls) -> HostSnapshot:
        mounts = workspace_mounts()
        return cls(
            processes=frozenset(p.key for p in live_processes()),
            cgroups=frozenset(sandcell_cgroups()),
            mounts=frozenset(mounts),
            cells_dirs=frozenset(_WORKSPACE_MOUNT.match(m)["cells"] for m in mounts),
            sockets=frozenset(listening_unix_sockets()),
        )


def _foreign_cells(before: HostSnapshot, basetemp: Path) -> set[str]:
    """Cells that belong to another sandcell instance on this host."""
    ours = str(basetemp)
    foreign = set()
    for mountpoint, cell in workspace_mounts().items():
        cells_dir = _WORKSPACE_MOUNT.match(mountpoint)["cells"]
        other_session = _PYTEST_BASETEMP.search(mountpoint) and not mountpoint.startswith(ours)
        if cells_dir in before.cells_dirs or other_session:
            foreign.add(cell)
    return foreign


def _own_lineage() -> set[int]:
    pids, pid = set(), os.getpid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        stat = _read(f"/proc/{pid}/stat")
        fields = stat[stat.rfind(b")") + 2 :].split()
        pid = int(fields[1]) if len(fields) > 1 else 0
    return pids


def leftover_cell_dirs(basetemp: Path) -> list[str]:
    found = []
    for directory, subdirs, _ in os.walk(basetemp):
        if os.path.basename(directory) == "cells":
            found.extend(os.path.join(directory, d) for d in subdirs if _CELL_ID.match(d))
            subdirs.clear()
    return found


def find_leaks(before: HostSnapshot, basetemp: Path) -> list[str]:
    """What this session left on the host, one line each (empty: nothing)."""
    basetemp = basetemp.resolve()
    foreign = _foreign_cells(before, basetemp)
    ours = str(basetemp)
    lineage = _own_lineage()
    leaks = []
    for p in live_processes():
        if p.key in before.processes or p.pid in lineage or p.cgroup_cell in foreign:
            continue
        if is_cell_process(p) or ours in p.cmdline:
            leaks.append(f"process {p.pid} (uid {p.uid}): {p.cmdline[:200]}")
    for path in sorted(sandcell_cgroups() - before.cgroups):
        name = os.path.basename(path)
        if name.startswith("cell-") and name[len("cell-") :] in foreign:
            continue
        leaks.append(f"cgroup {path}")
    for mountpoint, cell in sorted(workspace_mounts().items()):
        if mountpoint not in before.mounts and cell not in foreign:
            leaks.append(f"mount {mountpoint}")
    for path in sorted(listening_unix_sockets() - before.sockets):
        if path.startswith(ours):
            leaks.append(f"listening socket {path}")
    leaks.extend(f"cell directory {d}" for d in leftover_cell_dirs(basetemp))
    return leaks


def assert_nothing_leaked(before: HostSnapshot, basetemp: Path, grace_s: float = 15.0) -> None:
    """Waits up to `grace_s` for teardown in flight to finish, then fails listing the leaks."""
    deadline = time.monotonic() + grace_s
    while leaks := find_leaks(before, basetemp):
        if time.monotonic() > deadline:
            raise AssertionError(
                "the test session left sandcell resources on the host:\n  " + "\n  ".join(leaks)
            )
        time.sleep(0.25)
