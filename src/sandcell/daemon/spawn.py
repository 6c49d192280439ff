"""The one place commands are started, so every command gets the same confinement."""

from __future__ import annotations

import subprocess
from typing import Any


def spawn_command(argv: list[str], **popen_kwargs: Any) -> subprocess.Popen[bytes]:
    """`subprocess.Popen(argv, **popen_kwargs)` (vfork); callers ask for a session of the
    command's own with `start_new_session=True`."""
    return subprocess.Popen(argv, **popen_kwargs)
