"""Directory watches (`WatchDir`, and the sync SDK's CreateWatcher/GetWatcherEvents/
RemoveWatcher) by polling: sandcell's daemon has no file-change events, so a watch compares
successive listings of the directory and reports what appeared, changed and went.

Changes between two polls are seen as their net effect (a file made and removed in between is
not seen). A file written through the façade's own files API is reported at once, as envd's
upload reports it (CREATE for a new file, CHMOD for the owner it is given, WRITE), and the
poll then sees nothing new of it. Watchers live in the router process that made them,
bounded in number. A poll sees every filesystem alike, so envd 0.6.4's `allowNetworkMounts`
(lifting its refusal to watch NFS, CIFS or FUSE, where inotify misses changes) has no
refusal to lift here: a watch is the same with it or without.
"""

from __future__ import annotations

import asyncio
import contextlib
import posixpath
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from sandcell.compat.e2b import cellfiles
from sandcell.compat.e2b.envd.filesystem import entry_info, path_of
from sandcell.compat.e2b.gateway import Gateway
from sandcell.errors import ErrorCode, ServiceError
from sandcell.store import SandboxRecord

POLL_S = 0.2
RECURSIVE_DEPTH = 16
MAX_WATCHERS = 1024
MAX_PER_SANDBOX = 16
Snapshot = dict[str, dict[str, Any]]


async def _snapshot(
    gateway: Gateway, record: SandboxRecord, path: str, recursive: bool
) -> Snapshot:
    query = {"path": path, "depth": str(RECURSIVE_DEPTH if recursive else 1)}
    listed = await cellfiles.json(gateway, record, "GET", "list", query=query)
    return {entry["path"]: entry for entry in listed["entries"]}


def _name(root: str, entry_path: str) -> str:
    return entry_path if root == "." else entry_path[len(root) + 1 :]


def _events(root: str, old: Snapshot, new: Snapshot, include_entry: bool) -> list[dict[str, Any]]:
    events = []
    for path, entry in new.items():
        before = old.get(path)
        if before is None:
            kind = "EVENT_TYPE_CREATE"
        elif entry["type"] != "dir" and (before["size"], before["modified"]) != (
            entry["size"],
            entry["modified"],
        ):  # a folder's own mtime moves with what it holds, which inotify does not report
            kind = "EVENT_TYPE_WRITE"
        else:
            continue
        event: dict[str, Any] = {"name": _name(root, path), "type": kind}
        if include_entry:
            event["entry"] = entry_info(entry)
        events.append(event)
    events += [
        {"name": _name(root, path), "type": "EVENT_TYPE_REMOVE"} for path in old if path not in new
    ]
    return events


def _within(root: str, path: str, recursive: bool) -> bool:
    """Whether a watch of `root` sees `path` (cell paths: workspace-relative, or /tmp/...)."""
    if root == ".":
        inside = not path.startswith("/")
        rest = path
    else:
        inside = path.startswith(root + "/")
        rest = path[len(root) + 1 :]
    return inside and ((recursive and rest.count("/") < RECURSIVE_DEPTH) or "/" not in rest)


# What envd's upload does to a file, as its watchers see it: created (or truncated), given
# the sandbox user as owner, then written.
UPLOAD_NEW = ("EVENT_TYPE_CREATE", "EVENT_TYPE_CHMOD", "EVENT_TYPE_WRITE")
UPLOAD_EXISTING = ("EVENT_TYPE_WRITE", "EVENT_TYPE_CHMOD", "EVENT_TYPE_WRITE")


@dataclass(eq=False)
class Watcher:
    sandbox_id: str
    path: str
    recursive: bool
    include_entry: bool
    seen: Snapshot
    pending: list[dict[str, Any]] = field(default_factory=list)
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    async def poll(self, gateway: Gateway, record: SandboxRecord) -> list[dict[str, Any]]:
        now = await _snapshot(gateway, record, self.path, self.recursive)
        events, self.pending = self.pending, []
        self.wake.clear()
        events += _events(self.path, self.seen, now, self.include_entry)
        self.seen = now
        return events

    def wrote(self, entry: dict[str, Any], created: bool) -> None:
        """A file written through the files API: reported now, and known to the next poll."""
        path = entry["path"]
        name = _name(self.path, path)
        for kind in UPLOAD_NEW if created else UPLOAD_EXISTING:
            event: dict[str, Any] = {"name": name, "type": kind}
            if self.include_entry:
                event["entry"] = entry_info(entry)
            self.pending.append(event)
        self.seen[path] = entry
        self.wake.set()


LIVE: dict[str, set[Watcher]] = {}  # sandbox id: its watchers of either kind


def watching(sandbox_id: str, path: str) -> list[Watcher]:
    """The watchers of a sandbox that see `path` (a cell path)."""
    return [w for w in LIVE.get(sandbox_id, ()) if _within(w.path, path, w.recursive)]


def wrote(sandbox_id: str, entry: dict[str, Any], created: bool) -> None:
    """Tells the sandbox's watchers of `entry`, a file the files API has written."""
    for watcher in watching(sandbox_id, entry["path"]):
        watcher.wrote(entry, created)


def _forget(watcher: Watcher) -> None:
    mine = LIVE.get(watcher.sandbox_id)
    if mine is not None:
        mine.discard(watcher)
        if not mine:
            del LIVE[watcher.sandbox_id]


async def _start(gateway: Gateway, record: SandboxRecord, message: dict[str, Any]) -> Watcher:
    path, recursive = posixpath.normpath(path_of(message)), message.get("recursive") is True
    seen = await _snapshot(gateway, record, path, recursive)
    watcher = Watcher(record.id, path, recursive, message.get("includeEntry") is True, seen)
    LIVE.setdefault(record.id, set()).add(watcher)
    return watcher


class Watchers:
    def __init__(self) -> None:
        self._by_id: dict[str, Watcher] = {}

    def _get(self, record: SandboxRecord, message: dict[str, Any]) -> tuple[str, Watcher]:
        watcher_id = message.get("watcherId")
        watcher = self._by_id.get(watcher_id) if isinstance(watcher_id, str) else None
        if watcher is None or watcher.sandbox_id != record.id or not isinstance(watcher_id, str):
            raise ServiceError(ErrorCode.NOT_FOUND, f"watcher {watcher_id!r} not found")
        return watcher_id, watcher

    async def create(
        self, gateway: Gateway, record: SandboxRecord, message: dict[str, Any]
    ) -> dict[str, Any]:
        mine = sum(1 for w in self._by_id.values() if w.sandbox_id == record.id)
        if len(self._by_id) >= MAX_WATCHERS or mine >= MAX_PER_SANDBOX:
            raise ServiceError(ErrorCode.RATE_LIMITED, "too many directory watchers")
        watcher_id = f"w-{secrets.token_hex(8)}"
        self._by_id[watcher_id] = await _start(gateway, record, message)
        return {"watcherId": watcher_id}

    async def events(
        self, gateway: Gateway, record: SandboxRecord, message: dict[str, Any]
    ) -> dict[str, Any]:
        _, watcher = self._get(record, message)
        return {"events": await watcher.poll(gateway, record)}

    async def remove(
        self, gateway: Gateway, record: SandboxRecord, message: dict[str, Any]
    ) -> dict[str, Any]:
        watcher_id, watcher = self._get(record, message)
        del self._by_id[watcher_id]
        _forget(watcher)
        return {}


async def watch_dir(
    gateway: Gateway, record: SandboxRecord, message: dict[str, Any]
) -> AsyncIterator[dict[str, Any]]:
    watcher = await _start(gateway, record, message)
    try:
        yield {"start": {}}
        while True:
            # A poll every POLL_S, or at once when the files API has written something seen.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(watcher.wake.wait(), POLL_S)
            for event in await watcher.poll(gateway, record):
                yield {"filesystem": event}
    finally:
        _forget(watcher)


WATCHERS = Watchers()
UNARY = {
    "CreateWatcher": WATCHERS.create,
    "GetWatcherEvents": WATCHERS.events,
    "RemoveWatcher": WATCHERS.remove,
}
STREAMS = {"WatchDir": watch_dir}
