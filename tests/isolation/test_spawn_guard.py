"""The daemon's spawner confinement, for real in a child interpreter (Landlock and seccomp are
irreversible for the caller): what a spawned command can and cannot do to the process that
spawned it, without a cell around them."""

import json
import subprocess
import sys
import textwrap

import pyseccomp
import pytest

from sandcell.isolation import landlock

# Runs as the command: signals its spawner's process, the spawner thread, and a sibling.
ATTACK = """
import ctypes, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
parent, spawner, sibling, tgkill = map(int, sys.argv[1:])

def thread_kill():
    if libc.syscall(tgkill, parent, spawner, 0) != 0:
        raise OSError(ctypes.get_errno(), "tgkill")

out = {}
for name, call in (("kill parent", lambda: os.kill(parent, 0)),
                   ("kill spawner tid", lambda: os.kill(spawner, 0)),
                   ("tgkill spawner", thread_kill),
                   ("pidfd_open parent", lambda: os.close(os.pidfd_open(parent))),
                   ("kill sibling", lambda: os.kill(sibling, 9))):
    try:
        call()
        out[name] = "ok"
    except OSError as exc:
        out[name] = exc.errno
out["oom_score_adj"] = int(open("/proc/self/oom_score_adj").read())
print(json.dumps(out))
"""

# Runs as the daemon would: confines itself, starts the spawner, spawns a sibling and ATTACK.
DAEMON = """
import json, os, subprocess, sys, tempfile
from sandcell.daemon.exec import spawn
from sandcell.isolation import landlock, seccomp

attack, tgkill = sys.argv[1], sys.argv[2]
scratch = tempfile.mkdtemp()
oom = spawn.OwnOomScore()
landlock.restrict_self([scratch, "/dev/null"], deny_tcp=False)

def confine(pid, tid):
    landlock.restrict_self([scratch, "/dev/null"], deny_tcp=False, require_scoping=True)
    seccomp.guard_daemon(pid, tid)

spawn.start(oom, confine)
[spawner] = [t for t in map(int, os.listdir("/proc/self/task"))
             if open(f"/proc/self/task/{t}/comm").read().strip() == "spawner"]
sibling = spawn.spawn_command(["sleep", "30"])
probe = spawn.spawn_command(
    [sys.executable, "-c", attack, str(os.getpid()), str(spawner), str(sibling.pid), tgkill],
    stdout=subprocess.PIPE,
)
out = json.loads(probe.communicate()[0])
out["sibling killed"] = sibling.wait() == -9
out["own oom_score_adj"] = int(open("/proc/self/oom_score_adj").read())
print(json.dumps(out))
"""
EPERM = 1


@pytest.mark.skipif(not landlock.cell_support()[0], reason="needs Landlock signal scoping")
def test_a_command_cannot_touch_its_spawner_but_can_kill_its_sibling() -> None:
    tgkill = pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, "tgkill")
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(DAEMON), ATTACK, str(tgkill)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["kill parent"] == EPERM  # Landlock: the daemon is outside the commands' domain
    assert out["kill spawner tid"] == EPERM  # the guard: the spawner thread is inside it
    assert out["tgkill spawner"] == EPERM
    assert out["pidfd_open parent"] == EPERM
    assert out["kill sibling"] == "ok" and out["sibling killed"]  # commands share one domain
    assert out["oom_score_adj"] == 1000  # born the OOM killer's first choice...
    assert out["own oom_score_adj"] < 1000  # ...while the spawning process is back lower
