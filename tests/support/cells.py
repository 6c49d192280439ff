"""Helpers for tests that run real cells."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from sandcell.isolation import cgroups


def daemon_pids(cgroup_parent: str, cell_id: str) -> list[int]:
    """Host pids of the cell's daemon (found through its cgroup)."""
    cg = cgroups.detect(cgroup_parent).open(f"cell-{cell_id}")
    found = []
    for pid in cg.pids() if cg else ():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"sandcell.daemon" in cmdline and not cmdline.startswith(b"bwrap"):
            found.append(pid)
    return found


def kill_daemon(cgroup_parent: str, cell_id: str) -> None:
    for pid in daemon_pids(cgroup_parent, cell_id):
        os.kill(pid, signal.SIGKILL)


def cleanup_cgroup_parent(parent: str) -> None:
    with contextlib.suppress(cgroups.CgroupUnavailable):
        cgroups.detect(parent).destroy_all()
