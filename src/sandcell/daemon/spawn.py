"""The one door through which the daemon starts processes of the cell's user."""

from __future__ import annotations

import subprocess
from typing import Any


def spawn_command(argv: list[str], **popen_kwargs: Any) -> subprocess.Popen[bytes]:
    """Starts `argv` in a session (and process group) of its own, so it can be signalled and
    killed as a tree without touching the daemon."""
    return subprocess.Popen(argv, start_new_session=True, **popen_kwargs)
