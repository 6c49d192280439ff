"""E2B's paths and sandcell's workspace: `/home/user` (E2B's home) is the workspace.

Inside the cell the workspace is `/workspace` (and `$HOME`): commands see it there, so that
path is accepted too, for callers that learnt it from a command (`pwd`). A relative path is
relative to the workspace, as in sandcell. Any other absolute path is refused here; the daemon
confines what is left (dot segments, symlinks) on its own.
"""

from __future__ import annotations

import posixpath

from sandcell.errors import ErrorCode, ServiceError

HOME = "/home/user"
CELL_WORKSPACE = "/workspace"


def to_workspace(path: object) -> str:
    """The workspace-relative path for an E2B path ("." for the home itself)."""
    if path is None or path == "":
        return "."
    if not isinstance(path, str):
        raise ServiceError(ErrorCode.BAD_REQUEST, "a path must be a string")
    if "\x00" in path:
        raise ServiceError(ErrorCode.BAD_REQUEST, "a path cannot hold NUL")
    if path.startswith("~"):
        path = HOME + path[1:]
    if not path.startswith("/"):
        return path
    normal = posixpath.normpath(path)
    for root in (HOME, CELL_WORKSPACE):
        if normal == root:
            return "."
        if normal.startswith(root + "/"):
            return normal[len(root) + 1 :]
    raise ServiceError(
        ErrorCode.FORBIDDEN, f"{path} is outside {HOME}, the only directory a sandbox has"
    )


def to_e2b(relative: str) -> str:
    """E2B's absolute path for a workspace-relative one."""
    relative = relative.strip("/")
    return HOME if relative in ("", ".") else f"{HOME}/{relative}"
