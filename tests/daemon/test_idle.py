"""An idle daemon costs nothing: it does not wake up on a timer, yet stops at once on SIGTERM."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from support.daemons import RunningDaemon


def _wakeups(pid: int) -> int:
    """Voluntary context switches of the daemon's main (event loop) thread."""
    for line in Path(f"/proc/{pid}/task/{pid}/status").read_text().splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches in /proc status")


@pytest.mark.slow
def test_idle_daemon_does_not_tick(fresh_daemon: RunningDaemon) -> None:
    fresh_daemon.initialize()
    time.sleep(0.3)  # the initialising request's connection settles
    before = _wakeups(fresh_daemon.proc.pid)
    time.sleep(3)
    # A 0.1 s tick would be 30 wakeups; the orphan reaper's 5 s timer is at most one.
    assert _wakeups(fresh_daemon.proc.pid) - before <= 3


def test_sigterm_stops_an_idle_daemon_at_once(fresh_daemon: RunningDaemon) -> None:
    fresh_daemon.initialize()
    started = time.monotonic()
    fresh_daemon.proc.send_signal(signal.SIGTERM)
    assert fresh_daemon.proc.wait(5) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal
    assert time.monotonic() - started < 1.0
