"""The session-wide leak check: nothing of sandcell that a test session made may outlive it.

`HostSnapshot.take()` at session start, `assert_nothing_leaked(before, basetemp)` at its end.
Everything a session makes lives under its temporary directory (`basetemp`): cells dirs, data
dirs, sockets; or, what an unprivileged user must reach (basetemp is root's, 0700), in a
directory named with the session's `outside_prefix`. The check blames only what it can
attribute to the session, so other sandcell instances on the host (a developer's server,
another clone's test run) are never blamed, even when they start cells while this session
runs. A cell is this session's when its directory is
under `basetemp`, which one of these shows: its workspace mount, the claim in the host-wide uid
registry (`/run/sandcell-uids/<uid>` names the claiming cell's directory), or the directory
itself. What counts as a leak, when it was not there at the start:

* a live (non-zombie) process of one of those cells: run by its claimed uid, or in its cgroup;
* a live process run by a uid of the cell range that ran nothing when the session started and
  is not claimed now by a live cell of another sandcell. A cell's uid is its claim's only while
  the cell lives: a process that survived its cell's deletion (a detached tenant command, a
  cell made without cgroups) runs as a uid nobody claims, and the session that made the cell
  is the one that ran no process as that uid before it started. (A uid some other cell held
  at the start cannot be this session's until that cell's processes are gone, so it is never
  blamed; another sandcell that leaks a cell while this session runs is, rightly, a leak too);
* any live process whose command line names `basetemp` or the session's outside prefix (a
  `sandcell serve`, a bare daemon, a Redis server that a test started and did not stop), and
  the daemon of a cell whose bwrap names one of them (an unprivileged cell: it runs as its
  caller's uid, shared, and only its binds say whose it is);
* the cgroup of one of those cells (`<...>/sandcell*/cell-<id>`) in any hierarchy;
* a test parent cgroup (`<...>/sandcell-test-*`) holding one of those cells, or left empty
  while no other test session runs on the host (an empty one names no one);
* a loop mount of one of those cells' workspaces, a listening unix socket under `basetemp`, a
  cell directory left in a `cells` directory under `basetemp`.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sandcell.isolation.uids import DEFAULT_UID_BASE, DEFAULT_UID_COUNT, UID_REGISTRY

CELL_UIDS = range(DEFAULT_UID_BASE, DEFAULT_UID_BASE + DEFAULT_UID_COUNT)
CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_MAX_DEPTH = 8
_CELL_ID = re.compile(r"^c[0-9a-z-]{1,63}$")
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
    ppid: int
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
        yield Process(pid, int(tail[19]), uid, int(tail[1]), cmdline.strip(), cell)


def runs_a_cell(p: Process) -> bool:
    """bwrap (a cell's launcher or its PID namespace's init) or a cell's daemon."""
    return "sandcell.daemon" in p.cmdline or p.cmdline.startswith("bwrap ")


def is_cell_process(p: Process) -> bool:
    return p.uid in CELL_UIDS and runs_a_cell(p)


def outside_prefix(basetemp: Path) -> str:
    """The name prefix of the session's directories outside `basetemp` (for `tempfile`'s
    `prefix`), which tells its processes from another session's."""
    tag = hashlib.sha256(str(basetemp.resolve()).encode()).hexdigest()[:12]
    return f"sandcell-outside-{tag}-"


def names_session(p: Process, marks: tuple[str, ...], by_pid: dict[int, Process]) -> bool:
    """Whether `p`'s command line, or that of the bwrap above a cell's process, names one of
    `marks` (an unprivileged cell's bwrap binds its workspace by its host path)."""
    seen: set[int] = set()
    while p.pid not in seen:
        if any(mark in p.cmdline for mark in marks):
            return True
        seen.add(p.pid)
        parent = by_pid.get(p.ppid)
        if parent is None or not runs_a_cell(p) or not runs_a_cell(parent):
            return False
        p = parent
    return False


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
    cell_uids: frozenset[int]  # the uids of the cell range that ran something
    cgroups: frozenset[str]
    mounts: frozenset[str]
    sockets: frozenset[str]

    @classmethod
    def take(cls) -> HostSnapshot:
        processes = list(live_processes())
        return cls(
            processes=frozenset(p.key for p in processes),
            cell_uids=frozenset(p.uid for p in processes if p.uid in CELL_UIDS),
            cgroups=frozenset(sandcell_cgroups()),
            mounts=frozenset(workspace_mounts()),
            sockets=frozenset(listening_unix_sockets()),
        )


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root + "/")


@dataclass(frozen=True)
class Ours:
    """The cells of this session found on the host, and the host uids they claim."""

    cells: frozenset[str]
    uids: frozenset[int]
    foreign_uids: frozenset[int]  # claimed by a live cell of another sandcell

    @classmethod
    def find(cls, basetemp: Path) -> Ours:
        root = str(basetemp)
        cells = {cell for mount, cell in workspace_mounts().items() if _under(mount, root)}
        cells.update(os.path.basename(d) for d in leftover_cell_dirs(basetemp))
        uids, foreign = set(), set()
        for claim in _claims():
            cell_dir = _read(str(claim)).decode(errors="replace")
            if _under(cell_dir, root):
                cells.add(os.path.basename(cell_dir))
                uids.add(int(claim.name))
            elif os.path.isdir(cell_dir):
                foreign.add(int(claim.name))
        return cls(frozenset(cells), frozenset(uids), frozenset(foreign))

    def has(self, p: Process) -> bool:
        return is_cell_process(p) and (p.uid in self.uids or p.cgroup_cell in self.cells)

    def stray(self, p: Process, before: HostSnapshot) -> bool:
        """A process of the cell range's uid that this session's run made and no live cell
        claims (see the module's docstring)."""
        return (
            p.uid in CELL_UIDS
            and p.uid not in before.cell_uids
            and p.uid not in self.foreign_uids
            and p.uid not in self.uids  # a live cell of ours: judged by `has`
        )


def _claims() -> list[Path]:
    try:
        return [c for c in UID_REGISTRY.iterdir() if c.name.isdigit()]
    except OSError:
        return []


def _ancestry(pid: int) -> set[int]:
    pids = set()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        stat = _read(f"/proc/{pid}/stat")
        fields = stat[stat.rfind(b")") + 2 :].split()
        pid = int(fields[1]) if len(fields) > 1 else 0
    return pids


def other_test_sessions() -> list[int]:
    """Pids of pytest processes that are neither this session's ancestors nor descendants."""
    me = os.getpid()
    lineage = _ancestry(me)
    return [
        p.pid
        for p in live_processes()
        if "pytest" in p.cmdline and p.pid not in lineage and me not in _ancestry(p.pid)
    ]


def _test_parent_leaked(path: str, ours: Ours) -> bool:
    try:
        children = [e.name for e in os.scandir(path) if e.is_dir(follow_symlinks=False)]
    except OSError:
        return False  # gone meanwhile
    if children:
        return any(c.removeprefix("cell-") in ours.cells for c in children)
    return not other_test_sessions()


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
    root = str(basetemp)
    ours = Ours.find(basetemp)
    lineage = _ancestry(os.getpid())
    marks = (root, f"/{outside_prefix(basetemp)}")
    leaks = []
    processes = {p.pid: p for p in live_processes()}
    for p in processes.values():
        if p.key in before.processes or p.pid in lineage:
            continue
        if ours.has(p) or names_session(p, marks, processes):
            leaks.append(f"process {p.pid} (uid {p.uid}): {p.cmdline[:200]}")
        elif ours.stray(p, before):
            leaks.append(f"process {p.pid} of unclaimed cell uid {p.uid}: {p.cmdline[:200]}")
    for path in sorted(sandcell_cgroups() - before.cgroups):
        name = os.path.basename(path)
        if name.startswith("sandcell-test-"):
            leaked = _test_parent_leaked(path, ours)
        else:
            leaked = name.removeprefix("cell-") in ours.cells
        if leaked:
            leaks.append(f"cgroup {path}")
    for mountpoint, cell in sorted(workspace_mounts().items()):
        if mountpoint not in before.mounts and cell in ours.cells:
            leaks.append(f"mount {mountpoint}")
    for path in sorted(listening_unix_sockets() - before.sockets):
        if _under(path, root):
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
