"""E2B's paths and sandcell's workspace: `/home/user` (E2B's home) is the workspace.

A relative path is relative to the workspace, as in sandcell. Any other absolute path is
refused here; the daemon confines what is left (dot segments, symlinks) on its own.
"""

from __future__ import annotations

import posixpath

from sandcell.errors import ErrorCode, SandcellError

HOME = "/home/user"


def to_workspace(path: str | None) -> str:
    """The workspace-relative path for an E2B path ("." for the home itself)."""
    if not path:
        return "."
    if "\x00" in path:
        raise SandcellError(ErrorCode.BAD_REQUEST, "a path cannot hold NUL")
    if path.startswith("~"):
        path = HOME + path[1:]
    if not path.startswith("/"):
        return path
    normal = posixpath.normpath(path)
    if normal == HOME:
        return "."
    if normal.startswith(HOME + "/"):
        return normal[len(HOME) + 1 :]
    raise SandcellError(
        ErrorCode.FORBIDDEN, f"{path} is outside {HOME}, the only directory a sandbox has"
    )


def to_e2b(relative: str) -> str:
    """E2B's absolute path for a workspace-relative one."""
    relative = relative.strip("/")
    return HOME if relative in ("", ".") else f"{HOME}/{relative}"
