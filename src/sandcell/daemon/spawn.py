"""The one door through which the daemon starts processes of the cell's user."""

from __future__ import annotations

import subprocess
from typing import Any

from sandcell.daemon.runner import _prefer_for_oom_kill


def spawn_command(argv: list[str], **popen_kwargs: Any) -> subprocess.Popen[bytes]:
    """Starts `argv` in a session (and process group) of its own, so it can be signalled and
    killed as a tree without touching the daemon; under memory pressure the cell's OOM killer
    takes it before the daemon."""
    proc = subprocess.Popen(argv, start_new_session=True, **popen_kwargs)
    _prefer_for_oom_kill(proc.pid)
    return proc
