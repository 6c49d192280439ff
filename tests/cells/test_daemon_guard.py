"""Commands against their own daemon, for real (SPEC §3, §9): they cannot signal, trace or
chmod it, and a memory exhaustion costs them a command, never the daemon.

Commands run as the daemon's uid: without the guard, every attack here ended the sandbox.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from cells.conftest import Cell, wait_until
from sandcell.isolation.policy import CellPolicy

SIGKILL = 9
DAEMON_PID = 2  # in the cell's pid namespace: bwrap is 1, the daemon it starts is 2


def assert_daemon_unharmed(cell: Cell, daemon_host_pid: int) -> None:
    """The same daemon process answers, and the next exec works."""
    assert cell.owner.cells.alive(cell.info)
    assert cell.daemon_pid() == daemon_host_pid
    assert cell.run("echo next")["stdout"] == "next\n"


def no_sleep_left(cell: Cell) -> bool:
    """No `sleep` alive: an orphan killed a moment ago may be a zombie until reaped."""
    return wait_until(lambda: cell.run("pgrep -x sleep")["exit_code"] == 1, 10)


def test_kill_minus_one_ends_the_users_processes_only(make_cell: Callable[..., Cell]) -> None:
    cell = make_cell()
    daemon = cell.daemon_pid()
    assert cell.run("sleep 300 >/dev/null 2>&1 &")["exit_code"] == 0
    r = cell.run("kill -9 -1; echo survived")  # sh's kill(-1) spares only the caller
    assert r["stdout"] == "survived\n", r
    r = cell.run(f"kill -9 {DAEMON_PID}; kill -STOP {DAEMON_PID}; kill -9 -{DAEMON_PID}")
    assert r["exit_code"] != 0 and r["stderr"].count("not permitted") == 3, r
    assert no_sleep_left(cell)  # the background sleep is gone
    assert_daemon_unharmed(cell, daemon)


def test_commands_can_still_signal_each_other(cell: Cell) -> None:
    """All commands share one domain: `pkill` reaches what an earlier exec left running."""
    assert cell.run("sleep 300 >/dev/null 2>&1 &")["exit_code"] == 0
    r = cell.run("pkill -x sleep && echo killed")
    assert r["stdout"] == "killed\n", r
    assert no_sleep_left(cell)


SIGNAL_PROBE = """
import ctypes, fcntl, json, os, signal, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
nr = json.loads(sys.argv[1])
daemon = int(sys.argv[2])
info = ctypes.create_string_buffer(128)  # a zeroed siginfo; si_code 0 (SI_USER) is allowed

def call(name, *args):
    ctypes.set_errno(0)
    ret = libc.syscall(ctypes.c_long(nr[name]), *(ctypes.c_long(a) for a in args))
    return "ok" if ret >= 0 else ctypes.get_errno()

def info_call(name, *args):
    ctypes.set_errno(0)
    ret = libc.syscall(ctypes.c_long(nr[name]), *(ctypes.c_long(a) for a in args), info)
    return "ok" if ret >= 0 else ctypes.get_errno()

def sigio(owner):
    # SIGIO (here SIGKILL) to whoever owns the pipe, on the next write into it.
    r, w = os.pipe()
    try:
        fcntl.fcntl(r, fcntl.F_SETOWN, owner)
        fcntl.fcntl(r, 10, 9)  # F_SETSIG: SIGKILL rather than SIGIO
        fcntl.fcntl(r, fcntl.F_SETFL, os.O_ASYNC | os.O_NONBLOCK)
        os.write(w, b"x")
        return "ok"
    except OSError as exc:
        return exc.errno
    finally:
        os.close(r); os.close(w)

out = {}
tids = sorted(int(t) for t in os.listdir(f"/proc/{daemon}/task"))
names = {t: open(f"/proc/{daemon}/task/{t}/comm").read().strip() for t in tids}
out["spawner"] = [t for t in tids if names[t] == "spawner"]
for who in [daemon, *tids]:
    out[f"kill {who}"] = call("kill", who, 9)
    out[f"kill -{who}"] = call("kill", -who, 9)
    out[f"tkill {who}"] = call("tkill", who, 9)
    out[f"tgkill {daemon} {who}"] = call("tgkill", daemon, who, 9)
    out[f"rt_sigqueueinfo {who}"] = info_call("rt_sigqueueinfo", who, 9)
    out[f"rt_tgsigqueueinfo {who}"] = info_call("rt_tgsigqueueinfo", daemon, who, 9)
    out[f"pidfd_open {who}"] = call("pidfd_open", who, 0)
    out[f"pidfd_open thread {who}"] = call("pidfd_open", who, os.O_EXCL)  # PIDFD_THREAD
    fd = os.open(f"/proc/{who}", os.O_RDONLY | os.O_DIRECTORY)  # a pidfd by another name
    out[f"pidfd_send_signal /proc/{who}"] = call("pidfd_send_signal", fd, 9, 0, 0)
    out[f"pidfd_send_signal thread /proc/{who}"] = call("pidfd_send_signal", fd, 9, 0, 1)
    os.close(fd)
    out[f"F_SETOWN {who}"] = sigio(who)
    out[f"prlimit {who}"] = call("prlimit64", who, 0, ctypes.addressof(info), 0)  # CPU 0 s
    out[f"ptrace {who}"] = call("ptrace", 16, who, 0, 0)  # PTRACE_ATTACH
    out[f"ptrace seize {who}"] = call("ptrace", 0x4206, who, 0, 0)
owner_ex = (ctypes.c_int * 2)(0, tids[-1])  # F_OWNER_TID
r, w = os.pipe()
out["F_SETOWN_EX"] = call("fcntl", r, 15, ctypes.addressof(owner_ex))
print(json.dumps(out))
"""
SYSCALLS = [
    "kill",
    "tkill",
    "tgkill",
    "rt_sigqueueinfo",
    "rt_tgsigqueueinfo",
    "pidfd_open",
    "pidfd_send_signal",
    "prlimit64",
    "ptrace",
    "fcntl",
]


def _target(label: str) -> int:
    """The pid or tid a probe label ends with: "kill -3", "pidfd_send_signal /proc/3"."""
    return int(label.rsplit("/", 1)[-1].split()[-1].lstrip("-"))


def test_no_signal_pidfd_sigio_rlimit_or_trace_reaches_any_daemon_thread(
    make_cell: Callable[..., Cell],
) -> None:
    import pyseccomp

    cell = make_cell()
    daemon = cell.daemon_pid()
    numbers = {n: pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, n) for n in SYSCALLS}
    r = cell.py(SIGNAL_PROBE, json.dumps(numbers), str(DAEMON_PID))
    assert r["exit_code"] == 0, r
    result = json.loads(r["stdout"])
    [spawner] = result.pop("spawner")
    guarded = {DAEMON_PID, spawner}
    # Granted for the daemon's other threads, and harmless: a pidfd (pidfd_send_signal is
    # unavailable), SIGIO ownership (Landlock drops the signal), kill(-tid) (no such group).
    # The spawner thread shares the commands' domain: there the guard refuses even those.
    granted = ("pidfd_open ", "F_SETOWN ", "kill -")
    checked = {
        label: outcome
        for label, outcome in result.items()
        if not (label.startswith(granted) and _target(label) not in guarded)
    }
    assert {label: v for label, v in checked.items() if v == "ok"} == {}
    send = {v for label, v in checked.items() if label.startswith("pidfd_send_signal")}
    assert send == {errno.ENOSYS}
    assert {v for label, v in checked.items() if not label.startswith("pidfd_send")} == {
        errno.EPERM
    }
    assert_daemon_unharmed(cell, daemon)


def test_chmod_of_anything_of_the_daemon_fails(make_cell: Callable[..., Cell]) -> None:
    cell = make_cell()
    daemon = cell.daemon_pid()
    targets = [
        "/run/sandcell",
        "/run/sandcell/daemon.sock",
        cell.info.uds,
        str(Path(cell.info.uds).parent),
        "/opt/sandcell",
        "/opt/sandcell/src",
        "/opt/sandcell/src/sandcell/daemon/server.py",
        "/opt/sandcell/venv",
        "/opt/sandcell/venv/bin/python",
        f"/proc/{DAEMON_PID}",
        f"/proc/{DAEMON_PID}/oom_score_adj",
        f"/proc/{DAEMON_PID}/exe",
        "/etc/passwd",
        "/",
    ]
    code = """
    import json, os, sys
    out = {}
    for path in json.loads(sys.argv[1]):
        for mode in (0o777, 0o666):
            try:
                os.chmod(path, mode)
                out[f"{path} {mode:o}"] = "ok"
            except OSError as exc:
                out[f"{path} {mode:o}"] = exc.errno
    print(json.dumps(out))
    """
    result = cell.py_json(code, json.dumps(targets))
    assert {k: v for k, v in result.items() if v == "ok"} == {}
    # On the host, the socket and its directory are still the manager's and private to it.
    for path, kind, mode in ((cell.info.uds, stat.S_ISSOCK, 0o600),
                             (str(Path(cell.info.uds).parent), stat.S_ISDIR, 0o700)):  # fmt: skip
        st = os.stat(path)
        assert kind(st.st_mode) and stat.S_IMODE(st.st_mode) == mode, (path, oct(st.st_mode))
        assert st.st_uid == os.geteuid() != cell.info.uid
    assert_daemon_unharmed(cell, daemon)


def test_commands_are_born_the_oom_killers_first_choice(cell: Cell) -> None:
    # Read by the command itself, by what its shell forks at once, and by a grandchild.
    r = cell.sh(
        "cat /proc/self/oom_score_adj; sh -c 'cat /proc/self/oom_score_adj';"
        f" cat /proc/{DAEMON_PID}/oom_score_adj; echo 0 > /proc/self/oom_score_adj"
    )
    command, grandchild, daemon, *_ = r["stdout"].split()
    assert (command, grandchild) == ("1000", "1000")
    assert int(daemon) < 1000
    assert r["exit_code"] != 0  # and a command cannot lower its own score


@pytest.mark.slow
def test_memory_exhaustion_kills_commands_never_the_daemon(
    make_cell: Callable[..., Cell],
) -> None:
    cell = make_cell(CellPolicy())  # the default 512 MiB
    daemon = cell.daemon_pid()
    hog = "python3 -c 'import time; b = b\"x\" * (25 << 20); time.sleep(8)'"
    r = cell.sh(f"for i in $(seq 24); do {hog} & done; sleep 1; wait", timeout_s=60)
    assert r["exit_code"] in range(256), r  # the exec answered, whatever its fate
    assert cell.cgroup.oom_kills() >= 1  # the cell did run out of memory
    assert_daemon_unharmed(cell, daemon)
