"""Which confined directory a file path names: the workspace, and for the cell-wide table the
cell's /tmp too (SPEC §14.2: the E2B façade's files API reaches it; /v1's does not, §2.4).

A relative path is the workspace's. An absolute one is another place's when it lies under
that place's root, else the workspace's (under any of its names; elsewhere a 403). Entries
name a workspace path relative to it, as SPEC §2.4 says, and another place's path absolute,
so a caller can tell them apart and hand either back.
"""

from __future__ import annotations

import posixpath

from sandcell.daemon.files.workspace import Workspace, normal


class Places:
    def __init__(self, workspace: Workspace, *others: Workspace) -> None:
        self.workspace = workspace
        self.others = others

    def resolve(self, path: str) -> tuple[Workspace, str]:
        """The place of `path` and the path relative to its root."""
        normalised = normal(path)
        if normalised.startswith("/"):
            for place in self.others:
                if normalised == place.root or normalised.startswith(place.root + "/"):
                    return place, place.relative(normalised)
        return self.workspace, self.workspace.relative(path)

    def shown(self, place: Workspace, rel: str) -> str:
        """How an entry names `rel` of `place`."""
        if place is self.workspace:
            return rel
        return place.root if rel == "." else posixpath.join(place.root, rel)
