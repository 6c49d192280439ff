"""Deleting a sandbox kills every process of its cell, even where no cgroup holds them (SPEC §3:
"nothing of it is left on the host").

A cell whose template lets the cgroups layer degrade has no cgroup to kill it by. The attack: a
command that detaches itself the usual daemon way (fork, setsid, fork again), ignores SIGTERM
and SIGHUP, and outlives the exec that started it; then the sandbox is deleted. Real
conditions, no mocks: cgroups are missing because the LocalCells runs in a mount namespace where
no cgroup hierarchy is mounted (as on a host without them), or because it runs as an
unprivileged user, who can make no cgroups at all.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import sandcell
from cells.conftest import processes_of_uids, requires_cells, wait_until
from cells.test_fail_closed import NOBODY, unprivileged  # noqa: F401 - a fixture

# A double fork into a session of its own; the grandchild ignores SIGTERM and SIGHUP (kept
# across exec) and becomes `sleep 3600` with no descriptor of the exec's, so the exec returns,
# once the grandchild has exec'd: its copy of the pipe closes on exec, which ends the read.
DETACH = """
import os, signal
r, w = os.pipe()  # close-on-exec, as Python makes every descriptor
if os.fork() == 0:
    os.close(r)
    os.setsid()
    if os.fork() == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        null = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.execvp("sleep", ["sleep", "3600"])
    os._exit(0)
os.close(w)
os.wait()
os.read(r, 1)
"""

# Makes a cell without cgroups, detaches a process in it, reports the cell's processes (host
# pid and start time, found under its launcher), then has the cell destroyed by `destroyer`:
# "same" (the LocalCells that made it) or "fresh" (another one, as after a manager restart).
SCRIPT = """
import json, os, sys, time
from pathlib import Path
from sandcell import tokens
from sandcell.cellapi.client import DaemonClient
from sandcell.isolation.cell import LocalCells
from sandcell.isolation.policy import CellPolicy

cells_dir, destroyer, detach = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
cells = LocalCells(cells_dir)
assert cells.cgroups is None, "a cgroup hierarchy is reachable: not the condition under test"
degraded = {"cgroups"} if cells.privileged else {"cgroups", "disk_quota"}
policy = CellPolicy(memory_mb=128, pids_max=64, disk_mb=16, allow_degraded=frozenset(degraded))
bootstrap, session = tokens.generate_p256(), tokens.generate_p256()
info = cells.create("c1", policy, "sbx-1", tokens.public_pem(bootstrap))
client = DaemonClient({"uds": info.uds}, "sbx-1", session, timeout_s=30)
token = tokens.mint_bootstrap_token(bootstrap, "sbx-1", tokens.public_pem(session))
assert client.init(token).status_code == 200
result = client.exec(["/usr/bin/python3", "-c", detach], timeout_s=20)
assert result["exit_code"] == 0, result
client.close()


def stat(pid):
    data = Path(f"/proc/{pid}/stat").read_bytes()
    return data[data.rfind(b")") + 2 :].split()


def descendants(root):
    children = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                children.setdefault(int(stat(entry.name)[1]), []).append(int(entry.name))
            except OSError:
                pass
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


procs = []
for pid in descendants(cells._procs["c1"].pid):
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\\0")
        status = Path(f"/proc/{pid}/status").read_text()
        fields = stat(pid)
    except OSError:
        continue
    sigign = int(next(l for l in status.splitlines() if l.startswith("SigIgn:")).split()[1], 16)
    procs.append({
        "pid": pid, "start": int(fields[19]), "session": int(fields[3]),
        "cmdline": cmdline[0].decode(), "ignores_term": bool(sigign & (1 << 14)),
    })
(cells if destroyer == "same" else LocalCells(cells_dir)).destroy("c1")
print(json.dumps({"uid": info.uid, "processes": procs, "left": sorted(os.listdir(cells_dir))}))
"""


def run_script(cells_dir: Path, destroyer: str, *, as_nobody: bool) -> dict:
    """SCRIPT in a mount namespace of its own with no cgroup hierarchy, as root or nobody."""
    src = str(Path(sandcell.__file__).resolve().parents[1])  # the code under test
    python = [sys.executable, "-c", textwrap.dedent(SCRIPT), str(cells_dir), destroyer, DETACH]
    if as_nobody:
        python = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--"]
        python += [sys.executable, "-c", textwrap.dedent(SCRIPT), str(cells_dir), destroyer]
        python += [DETACH]
    hide_cgroups = 'umount -R /sys/fs/cgroup 2>/dev/null || true; exec "$@"'
    unshare = ["unshare", "--mount", "--propagation", "private", "sh", "-c", hide_cgroups, "sh"]
    r = subprocess.run(
        [*unshare, *python],
        capture_output=True, text=True, timeout=90, cwd="/",
        env={"PATH": os.environ["PATH"], "HOME": str(cells_dir.parent), "PYTHONPATH": src},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def alive(process: dict) -> bool:
    """The same process (pid and start time) still runs, and is no zombie."""
    try:
        data = Path(f"/proc/{process['pid']}/stat").read_bytes()
    except OSError:
        return False
    fields = data[data.rfind(b")") + 2 :].split()
    return fields[0] != b"Z" and int(fields[19]) == process["start"]


def the_detached(result: dict) -> dict:
    """The attack happened: a sleeper in a session apart from the daemon's, ignoring SIGTERM."""
    sleepers = [p for p in result["processes"] if p["cmdline"] == "sleep"]
    assert len(sleepers) == 1, result
    sessions = {p["session"] for p in result["processes"] if "python" in p["cmdline"]}
    assert sleepers[0]["ignores_term"] and sleepers[0]["session"] not in sessions, result
    return sleepers[0]


@requires_cells
@pytest.mark.parametrize("destroyer", ["same", "fresh"])
def test_deleting_a_cell_without_cgroups_kills_its_detached_processes(
    tmp_path: Path, destroyer: str
) -> None:
    result = run_script(tmp_path / "cells", destroyer, as_nobody=False)
    the_detached(result)
    uid = result["uid"]
    assert result["left"] == []

    def left() -> dict[int, str]:
        return processes_of_uids({uid})

    assert wait_until(lambda: not left(), 5), f"processes of cell uid {uid} survive: {left()}"
    assert not [p for p in result["processes"] if alive(p)]


@requires_cells
def test_deleting_an_unprivileged_cell_kills_its_detached_processes(
    unprivileged: tuple[Path, str],  # noqa: F811 - the fixture imported above
) -> None:
    """Without root the cell's uid is its caller's, shared with everything else the caller
    runs: the cell's PID namespace is what kills it."""
    cells_dir, _ = unprivileged
    result = run_script(cells_dir, "same", as_nobody=True)
    the_detached(result)
    assert result["uid"] == NOBODY and result["left"] == []

    def left() -> list[dict]:
        return [p for p in result["processes"] if alive(p)]

    assert wait_until(lambda: not left(), 5), f"processes of the cell survive: {left()}"
