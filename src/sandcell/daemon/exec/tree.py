"""Process-tree bookkeeping: which processes belong to a command, and killing all of them.

A command runs in its own session and process group. Killing the group is not enough: a
descendant may `setsid()` away, and a killed parent's children get re-parented. The daemon is
therefore a child subreaper, so orphans of its commands re-parent to it; a kill walks the live
process table (tree, group, session, and orphans adopted since the command started) in rounds
until nothing is left.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
from dataclasses import dataclass
from typing import Protocol

_PR_SET_CHILD_SUBREAPER = 36
_KILL_ROUNDS = 8


@dataclass(frozen=True)
class ProcInfo:
    ppid: int
    pgid: int
    sid: int
    state: str
    start_ticks: int


class OrphanSource(Protocol):
    """Whoever knows which children are the event loop's own (and must not be reaped here)."""

    @property
    def running_pids(self) -> set[int]: ...


def become_subreaper() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


def read_proc(pid: int) -> ProcInfo | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    # The command name may contain spaces and parentheses: split after the last ')'.
    fields = raw[raw.rindex(b")") + 2 :].split()
    return ProcInfo(
        int(fields[1]), int(fields[2]), int(fields[3]), fields[0].decode(), int(fields[19])
    )


def snapshot() -> dict[int, ProcInfo]:
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (info := read_proc(int(name))) is not None:
            table[int(name)] = info
    return table


def _members(
    root: int,
    start_ticks: int,
    table: dict[int, ProcInfo],
    other_roots: set[int],
    adopted: bool = True,
) -> set[int]:
    me = os.getpid()
    found = {p for p, i in table.items() if i.state != "Z" and root in (i.pgid, i.sid)}
    found |= {
        p
        for p, i in table.items()
        if adopted
        and i.ppid == me
        and p not in other_roots
        and i.start_ticks >= start_ticks
        and i.state != "Z"
    }
    if root in table:
        found.add(root)
    children: dict[int, list[int]] = {}
    for p, i in table.items():
        children.setdefault(i.ppid, []).append(p)
    stack = list(found)
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in found and table[child].state != "Z":
                found.add(child)
                stack.append(child)
    found.discard(me)
    return found


def kill_command_tree(root: int, other_roots: set[int], adopted: bool = True) -> None:
    """SIGKILLs the command `root` and everything that descends from it.

    `adopted`: also the orphans the daemon adopted since `root` started: right for a
    command, during whose short life they are its own escapees; wrong for a long-lived code
    context, during whose life other commands leave background processes that must live on.
    """
    info = read_proc(root)
    start_ticks = info.start_ticks if info else 0
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(root, signal.SIGKILL)
    for _ in range(_KILL_ROUNDS):
        targets = _members(root, start_ticks, snapshot(), other_roots, adopted)
        if not targets:
            return
        for pid in targets:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def reap_adopted(tracked: set[int]) -> None:
    """Collects zombies of orphans the subreaper adopted (never a tracked command's own)."""
    while True:
        try:
            # WNOWAIT peeks: the common case (no zombie at all) costs one system call.
            found = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if found is None:
            return
        if found.si_pid in tracked:
            break
        with contextlib.suppress(ChildProcessError):
            os.waitpid(found.si_pid, os.WNOHANG)
    _reap_untracked_zombies(tracked)


def _reap_untracked_zombies(tracked: set[int]) -> None:
    me = os.getpid()
    for pid, info in snapshot().items():
        if info.ppid == me and info.state == "Z" and pid not in tracked:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
