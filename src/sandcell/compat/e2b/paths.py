"""E2B's paths and the cell's places: `/home/user` (E2B's home) is the workspace.

Every cell has the workspace at `/home/user` as well as `/workspace` (cellapi.layout), and a
sandbox made through the façade has `HOME=/home/user`, so commands start there and both names
work everywhere. A relative path is relative to the workspace, as in sandcell.

`to_workspace` gives the workspace-relative path of a command's or a context's directory
(elsewhere: FORBIDDEN, which the process service enters with a shell). `to_cell` gives the
path the daemon's cell-wide file table takes (`/cell/files`): workspace-relative, or absolute
for the cell's private /tmp, which E2B's files API reaches too (SPEC §14.2), and the cell's
root, which a daemon inside a cell reads (read-only). The daemon confines each place on its
own (dot segments, symlinks) and refuses what lies in none.
"""

from __future__ import annotations

import posixpath

from sandcell.cellapi.layout import WORKSPACE, WORKSPACE_ALIASES
from sandcell.errors import ErrorCode, ServiceError

HOME = WORKSPACE_ALIASES[0]
CELL_WORKSPACE = WORKSPACE
# The E2B sandbox's own environment: where its commands and contexts start (the daemon
# starts them in $HOME when that names the workspace).
SANDBOX_ENV = {"HOME": HOME}


def _absolute(path: object) -> str | None:
    """`path` normalised when absolute (`~` is the home), None for a relative one."""
    if not isinstance(path, str):
        raise ServiceError(ErrorCode.BAD_REQUEST, "a path must be a string")
    if "\x00" in path:
        raise ServiceError(ErrorCode.BAD_REQUEST, "a path cannot hold NUL")
    if path.startswith("~"):
        path = HOME + path[1:]
    if not path.startswith("/"):
        return None
    return "/" + posixpath.normpath(path).lstrip("/")


def _beneath(normal: str, root: str) -> str | None:
    if normal == root:
        return "."
    return normal[len(root) + 1 :] if normal.startswith(root + "/") else None


def _relative(path: object) -> str | None:
    """The workspace-relative path for an E2B path, None for an absolute one elsewhere."""
    if path is None or path == "":
        return "."
    normal = _absolute(path)
    if normal is None:
        assert isinstance(path, str)
        return path
    for root in (HOME, CELL_WORKSPACE):
        if (relative := _beneath(normal, root)) is not None:
            return relative
    return None


def to_workspace(path: object) -> str:
    """The workspace-relative path for an E2B path ("." for the home itself)."""
    relative = _relative(path)
    if relative is None:
        raise ServiceError(
            ErrorCode.FORBIDDEN, f"{path} is outside {HOME}, the sandbox's home and workspace"
        )
    return relative


def to_cell(path: object) -> str:
    """The cell-wide file table's path for an E2B path: workspace-relative, else absolute.
    The daemon decides what lies elsewhere: the cell's /tmp, the cell's root (read-only,
    when it runs inside a cell), or a 403."""
    relative = _relative(path)
    if relative is not None:
        return relative
    normal = _absolute(path)
    assert normal is not None  # a relative path is the workspace's
    return normal


def to_e2b(path: str) -> str:
    """E2B's absolute path for an entry's path: workspace-relative, or absolute (/tmp)."""
    if path.startswith("/"):
        return path
    relative = path.strip("/")
    return HOME if relative in ("", ".") else f"{HOME}/{relative}"
