"""Every command the daemon runs is started here, by one confined thread (SPEC §3, §9).

Commands run as the daemon's uid, so the kernel's same-uid rules would let them signal it
(`kill -9 -1`). Two fences keep them off:

- Landlock domains belong to threads. The spawner thread nests a domain of its own inside
  the daemon's (the same write rules, scoped for signals and abstract unix sockets):
  every command inherits it, and a scoped domain cannot signal a process outside it, such as
  the daemon's other threads. All commands share that one domain, so they can still signal
  each other (`pkill` of what an earlier exec started in the background).
- The spawner thread itself is in that domain: it also loads a seccomp filter, inherited by
  commands, that refuses signals, pidfds, SIGIO ownership and rlimits aimed at it or at the
  daemon (isolation/seccomp.py `guard_daemon`). The same filter keeps scheduling calls
  (nice, SCHED_IDLE, affinity, I/O priority) to the caller itself (target 0): the daemon's
  threads come and go, so no list of them could be fenced, and a tenant who slowed them
  would slow the answers to every later request.

The OOM killer must take commands first (SPEC §3). A child inherits its parent's
oom_score_adj when it is forked, and anything written after its exec races with what it forks
first (a shell forks within a millisecond, often before the daemon's write lands). So the
spawner raises the daemon's own score to 1000 around each spawn, through a descriptor opened
before any Landlock (neither the daemon nor commands may write /proc), and lowers it back:
every command and all it forks start at 1000. A failed write fails the spawn (the command
is not started unprotected). Residual race: for the duration of one vfork+exec (~0.15 ms)
the daemon also stands at 1000, and an OOM kill in that window takes the largest process at
1000, which may be the daemon.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import queue
import subprocess
import threading
from collections.abc import Callable, Iterator
from typing import Any

COMMAND_OOM_SCORE_ADJ = 1000
THREAD_NAME = b"spawner"  # its comm in /proc/<daemon>/task/<tid>: the thread commands share
_PR_SET_NAME = 15

Confinement = Callable[[int, int], None]  # (daemon pid, spawner tid) -> None


class OwnOomScore:
    """The daemon's /proc/self/oom_score_adj, opened once while /proc is still writable."""

    def __init__(self) -> None:
        self._fd = os.open("/proc/self/oom_score_adj", os.O_RDWR | os.O_CLOEXEC)
        self._own = os.pread(self._fd, 16, 0).strip()

    @contextlib.contextmanager
    def raised(self) -> Iterator[None]:
        """While inside, children are forked at 1000; after, the daemon is back at its own
        score (at or above the launcher's floor, so no privilege is needed either way)."""
        self._write(str(COMMAND_OOM_SCORE_ADJ).encode())
        try:
            yield
        finally:
            self._write(self._own)

    def _write(self, value: bytes) -> None:
        try:
            os.pwrite(self._fd, value, 0)
        except OSError as exc:
            raise OSError(exc.errno, f"cannot set the OOM score to {value.decode()}") from exc


class _Call:
    """One call handed to the spawner thread, and its outcome."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = threading.Lock()
        self.done.acquire()

    def run(self) -> None:
        try:
            self.result = self.fn()
        except BaseException as exc:  # handed back to the caller, raised there
            self.error = exc
        finally:
            self.done.release()

    def wait(self) -> Any:
        self.done.acquire()
        if self.error is not None:
            raise self.error
        return self.result


class _Spawner:
    """A persistent thread that confines itself once, then runs every spawn."""

    def __init__(self, oom_score: OwnOomScore, confine: Confinement | None) -> None:
        self.oom_score = oom_score
        self._calls: queue.SimpleQueue[_Call] = queue.SimpleQueue()
        ready = _Call(lambda: confine(os.getpid(), threading.get_native_id()) if confine else None)
        thread = threading.Thread(target=self._serve, args=(ready,), name="spawner", daemon=True)
        thread.start()
        ready.wait()  # a confinement that failed raises here: the daemon does not start

    def _serve(self, ready: _Call) -> None:
        ctypes.CDLL(None).prctl(_PR_SET_NAME, ctypes.c_char_p(THREAD_NAME), 0, 0, 0)
        ready.run()
        if ready.error is not None:
            return
        while True:
            self._calls.get().run()

    def call(self, fn: Callable[[], Any]) -> Any:
        call = _Call(fn)
        self._calls.put(call)
        return call.wait()


_spawner: _Spawner | None = None


def start(oom_score: OwnOomScore, confine: Confinement | None) -> None:
    """Starts the spawner thread, confined by `confine` (None: a daemon run unconfined)."""
    global _spawner
    if _spawner is not None:
        raise RuntimeError("the spawner thread is already running")
    _spawner = _Spawner(oom_score, confine)


def spawn_command(argv: list[str], **popen_kwargs: Any) -> subprocess.Popen[bytes]:
    """`subprocess.Popen(argv, **popen_kwargs)` from the spawner thread, the command born as
    the OOM killer's first choice. The only way the daemon starts a command."""
    spawner = _spawner
    if spawner is None:
        raise RuntimeError("spawn_command before the spawner thread was started")

    def spawn() -> subprocess.Popen[bytes]:
        with spawner.oom_score.raised():
            return subprocess.Popen(argv, **popen_kwargs)

    result: subprocess.Popen[bytes] = spawner.call(spawn)
    return result
