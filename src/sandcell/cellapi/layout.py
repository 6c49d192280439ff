"""Where a cell's places are, as both sides name them (SPEC §3, §14.2).

The workspace is `/workspace`; every cell also has it at `/home/user`, E2B's home, so code
written for E2B finds its files where it left them, in commands as in the files API. The
daemon takes a name as the workspace's only when it is the same directory (a pod without
that mount has no such name). `/tmp` is the cell's own tmpfs.
"""

from __future__ import annotations

WORKSPACE = "/workspace"
WORKSPACE_ALIASES = ("/home/user",)
SCRATCH = "/tmp"  # noqa: S108 - the cell's private tmpfs, not the host's
