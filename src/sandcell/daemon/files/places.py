"""Which confined directory a file path names: the workspace, and for the cell-wide table the
cell's /tmp too (SPEC §14.2: the E2B façade's files API reaches it; /v1's does not, §2.4),
and, in a daemon that runs inside a cell, the cell's root, read-only (files/root.py).

A relative path is the workspace's. An absolute one is another place's when it lies under
that place's root, the workspace's under any of its names, else the root's where there is
one (elsewhere a 403). Entries name a workspace path relative to it, as SPEC §2.4 says, and
another place's path absolute, so a caller can tell them apart and hand either back.
"""

from __future__ import annotations

import posixpath

from sandcell.daemon.files.workspace import Workspace, normal
from sandcell.errors import ErrorCode, ServiceError


class Places:
    def __init__(
        self, workspace: Workspace, *others: Workspace, root: Workspace | None = None
    ) -> None:
        self.workspace = workspace
        self.others = others
        self.root = root

    def resolve(self, path: str, change: bool = False) -> tuple[Workspace, str]:
        """The place of `path` and the path relative to its root; `change`: the call
        writes, moves or removes there, which a read-only place refuses."""
        normalised = normal(path)
        place = self.workspace
        if normalised.startswith("/"):
            place = next(
                (p for p in self.others if _under(normalised, p.root)),
                self.workspace
                if self.root is None or any(_under(normalised, n) for n in self.workspace.names)
                else self.root,
            )
        if change and not place.writable:
            raise ServiceError(
                ErrorCode.FORBIDDEN,
                f"{path}: {place.place} is read-only to the files API, which writes "
                f"beneath {', '.join(self.writable_names())}",
                {"path": path},
            )
        return place, place.relative(path)

    def writable_names(self) -> list[str]:
        return [n for p in (self.workspace, *self.others) if p.writable for n in p.names]

    def shown(self, place: Workspace, rel: str) -> str:
        """How an entry names `rel` of `place`."""
        if place is self.workspace:
            return rel
        return place.root if rel == "." else posixpath.join(place.root, rel)


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root + "/")
