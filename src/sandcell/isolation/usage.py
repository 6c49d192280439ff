"""What a local cell uses now: CPU time, memory and pids from its cgroup, disk from its
workspace. Read-only: the cgroup's files are found by name in whichever of its directories
holds them, so one reader serves cgroup v2 and v1 alike."""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass

from sandcell.isolation.cgroups import CellCgroup, _keyed, _read

CPU_SAMPLE_S = 0.1
_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class CellUsage:
    cpu_used_s: float | None
    cpu_percent: float | None  # of one CPU, over the last CPU_SAMPLE_S
    memory_bytes: int | None
    pids: int | None
    disk_used_bytes: int


def measure(cgroup: CellCgroup | None, workspace: str) -> CellUsage:
    """Blocks for CPU_SAMPLE_S (two CPU readings); run it in a thread."""
    if cgroup is None:
        return CellUsage(None, None, None, None, disk_used_bytes(workspace))
    before, started = cpu_seconds(cgroup), time.monotonic()
    time.sleep(CPU_SAMPLE_S)
    after, elapsed = cpu_seconds(cgroup), time.monotonic() - started
    return CellUsage(
        cpu_used_s=round(after, 6),
        cpu_percent=round(max(after - before, 0.0) / elapsed * 100, 2),
        memory_bytes=_number(cgroup, "memory.current", "memory.usage_in_bytes"),
        pids=_number(cgroup, "pids.current"),
        disk_used_bytes=disk_used_bytes(workspace),
    )


def cpu_seconds(cgroup: CellCgroup) -> float:
    """v2: cpu.stat's usage_usec. v1 without a cpuacct hierarchy for cells: the CPU time of
    the cell's live processes and of the children they reaped (from /proc)."""
    stat = _file(cgroup, "cpu.stat")
    if stat is not None and (usec := _keyed(stat).get("usage_usec")) is not None:
        return usec / 1e6
    if (usage := _file(cgroup, "cpuacct.usage")) is not None:
        return int(_read(usage)) / 1e9
    ticks = 0
    for pid in cgroup.pids():
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = _read(f"/proc/{pid}/stat").rsplit(")", 1)[1].split()
            ticks += sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
    return ticks / _TICKS_PER_S


def disk_used_bytes(root: str) -> int:
    """Allocated bytes under `root` (hard links counted once, symlinks not followed)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    stack = [root]
    while stack:
        with contextlib.suppress(OSError), os.scandir(stack.pop()) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    st = entry.stat(follow_symlinks=False)
                    if (st.st_dev, st.st_ino) in seen:
                        continue
                    seen.add((st.st_dev, st.st_ino))
                    total += st.st_blocks * 512
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
    return total


def _file(cgroup: CellCgroup, name: str) -> str | None:
    for directory in cgroup.dirs:
        path = os.path.join(directory, name)
        if os.path.exists(path):
            return path
    return None


def _number(cgroup: CellCgroup, *names: str) -> int | None:
    for name in names:
        if (path := _file(cgroup, name)) is not None:
            with contextlib.suppress(OSError, ValueError):
                return int(_read(path))
    return None
