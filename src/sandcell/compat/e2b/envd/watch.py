"""Directory watches (`WatchDir`, and the sync SDK's CreateWatcher/GetWatcherEvents/
RemoveWatcher) by polling: sandcell's daemon has no file-change events, so a watch compares
successive listings of the directory and reports what appeared, changed and went.

Changes between two polls are seen as their net effect (a file made and removed in between is
not seen). Watchers live in the router process that made them, bounded in number.
"""

from __future__ import annotations

import asyncio
import posixpath
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
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
        elif (before["size"], before["modified"]) != (entry["size"], entry["modified"]):
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


@dataclass
class Watcher:
    sandbox_id: str
    path: str
    recursive: bool
    include_entry: bool
    seen: Snapshot

    async def poll(self, gateway: Gateway, record: SandboxRecord) -> list[dict[str, Any]]:
        now = await _snapshot(gateway, record, self.path, self.recursive)
        events, self.seen = _events(self.path, self.seen, now, self.include_entry), now
        return events


async def _start(gateway: Gateway, record: SandboxRecord, message: dict[str, Any]) -> Watcher:
    path, recursive = posixpath.normpath(path_of(message)), message.get("recursive") is True
    seen = await _snapshot(gateway, record, path, recursive)
    return Watcher(record.id, path, recursive, message.get("includeEntry") is True, seen)


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
        watcher_id, _ = self._get(record, message)
        del self._by_id[watcher_id]
        return {}


async def watch_dir(
    gateway: Gateway, record: SandboxRecord, message: dict[str, Any]
) -> AsyncIterator[dict[str, Any]]:
    watcher = await _start(gateway, record, message)
    yield {"start": {}}
    while True:
        await asyncio.sleep(POLL_S)
        for event in await watcher.poll(gateway, record):
            yield {"filesystem": event}


WATCHERS = Watchers()
UNARY = {
    "CreateWatcher": WATCHERS.create,
    "GetWatcherEvents": WATCHERS.events,
    "RemoveWatcher": WATCHERS.remove,
}
STREAMS = {"WatchDir": watch_dir}
