"""Commands against their own daemon's scheduling, for real (SPEC §3, §9; issue 26, hole 12).

Commands share the daemon's uid, so the kernel's same-uid rules let them renice, SCHED_IDLE,
pin and lower the I/O priority of every daemon thread: a tenant could not end the daemon,
but could starve it. Each attack here is made with the tool a tenant would use, on every
thread of the daemon, and the daemon's scheduling is then read from the host.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from cells.conftest import Cell

DAEMON_PID = 2  # in the cell's pid namespace: bwrap is 1, the daemon it starts is 2

# Every tool, on every thread of the daemon, and on its process group and uid as a whole.
ATTACK = f"""
pgid=$(cut -d')' -f2 /proc/{DAEMON_PID}/stat | cut -d' ' -f4)
uid=$(id -u)
try() {{ "$@" >/dev/null 2>&1; echo "$* => $?"; }}
for tid in $(ls /proc/{DAEMON_PID}/task); do
  try renice -n 19 -p "$tid"
  try chrt --idle -p 0 "$tid"
  try chrt --batch -p 0 "$tid"
  try taskset -p 0x1 "$tid"
  try ionice -c3 -p "$tid"
done
try renice -n 19 -g "$pgid"
try renice -n 19 -u "$uid"
try chrt --all-tasks --idle -p 0 {DAEMON_PID}
try taskset --all-tasks -p 0x1 {DAEMON_PID}
try ionice -c3 -P "$pgid"
try ionice -c3 -u "$uid"
"""

# The calls the tools do not make (sched_setparam, sched_setattr), and garbage in the upper
# half of a target that the kernel reads as a 32-bit pid.
RAW_ATTACK = """
import ctypes, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
nr = json.loads(sys.argv[1])
daemon = int(sys.argv[2])
attr = (ctypes.c_uint32 * 14)(56, 5)  # struct sched_attr: size 56, SCHED_IDLE
param = ctypes.c_int(0)

def call(name, *args):
    ctypes.set_errno(0)
    ret = libc.syscall(ctypes.c_long(nr[name]), *(ctypes.c_long(a) for a in args))
    return "ok" if ret >= 0 else ctypes.get_errno()

out = {}
for tid in sorted(int(t) for t in os.listdir(f"/proc/{daemon}/task")):
    out[f"sched_setparam {tid}"] = call("sched_setparam", tid, ctypes.addressof(param))
    out[f"sched_setattr {tid}"] = call("sched_setattr", tid, ctypes.addressof(attr), 0)
    out[f"setpriority hi|{tid}"] = call("setpriority", 0, (1 << 32) | tid, 19)
    out[f"setpriority user hi|0"] = call("setpriority", (1 << 32) | 2, 0, 19)
print(json.dumps(out))
"""
RAW_SYSCALLS = ("sched_setparam", "sched_setattr", "setpriority")


def host_tids(pid: int) -> list[int]:
    return sorted(int(t.name) for t in Path(f"/proc/{pid}/task").iterdir())


def scheduling(pid: int) -> dict[int, tuple[str, ...]]:
    """Each thread's nice value, policy, allowed CPUs and I/O priority, read by the host."""
    state = {}
    for tid in host_tids(pid):
        task = Path(f"/proc/{pid}/task/{tid}")
        fields = task.joinpath("stat").read_text().rpartition(")")[2].split()
        nice, policy = fields[16], fields[38]  # stat fields 19 and 41, after pid and comm
        cpus = next(
            line.split(":", 1)[1].strip()
            for line in task.joinpath("status").read_text().splitlines()
            if line.startswith("Cpus_allowed_list:")
        )
        io = subprocess.run(["ionice", "-p", str(tid)], capture_output=True, text=True, check=True)
        state[tid] = (nice, policy, cpus, io.stdout.strip())
    return state


def test_commands_cannot_touch_the_scheduling_of_any_daemon_thread(cell: Cell) -> None:
    import pyseccomp

    daemon = cell.daemon_pid()
    before = scheduling(daemon)
    r = cell.sh(ATTACK)
    assert r["exit_code"] == 0, r
    outcomes = dict(line.rsplit(" => ", 1) for line in r["stdout"].splitlines())
    assert {attack: code for attack, code in outcomes.items() if code == "0"} == {}, r
    numbers = {n: pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, n) for n in RAW_SYSCALLS}
    raw = cell.py_json(RAW_ATTACK, json.dumps(numbers), str(DAEMON_PID))
    assert {attack: v for attack, v in raw.items() if v != 1} == {}  # all EPERM
    after = scheduling(daemon)
    assert {tid: after[tid] for tid in before if tid in after} == {
        tid: state for tid, state in before.items() if tid in after
    }
    assert cell.run("echo still-served")["stdout"] == "still-served\n"


def test_a_command_still_tunes_itself_and_its_children(cell: Cell) -> None:
    """0 names the caller: set on itself, inherited by what it starts, or set on its own
    process group (a command leads a session of its own, the daemon is not in it)."""
    r = cell.py_json(
        """
        import json, os, subprocess
        os.setpriority(os.PRIO_PROCESS, 0, 3)
        os.sched_setaffinity(0, {0})
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
        print(json.dumps([os.getpriority(os.PRIO_PROCESS, 0), sorted(os.sched_getaffinity(0)),
                          os.sched_getscheduler(0) == os.SCHED_BATCH]))
        """
    )
    assert r == [3, [0], True]
    stat = "cut -d')' -f2 /proc/self/stat | cut -d' ' -f18,40"  # nice and policy (19, 41)
    r = cell.sh(
        f'nice -n 5 sh -c "{stat}"; chrt --idle 0 sh -c "{stat}";'
        " taskset -c 1 grep Cpus_allowed_list /proc/self/status; ionice -c3 ionice;"
        " sleep 30 & renice -n 9 -g 0 >/dev/null && cut -d')' -f2 /proc/$!/stat | cut -d' ' -f18;"
        " kill $!"
    )
    assert r["stdout"].split("\n")[:5] == [
        "5 0",
        "0 5",
        "Cpus_allowed_list:\t1",
        "idle",
        "9",
    ], r
