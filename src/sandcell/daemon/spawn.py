"""The one place commands are started, so every command gets the same confinement."""

from __future__ import annotations

import subprocess
from typing import Any


def spawn_command(argv: list[str], **popen_kwargs: Any) -> subprocess.Popen[bytes]:
    """Starts `argv` in a session (and process group) of its own, through vfork."""
    return subprocess.Popen(argv, start_new_session=True, **popen_kwargs)
