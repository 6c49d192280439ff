"""envd's `filesystem.Filesystem` service on the daemon's cell-wide file table (SPEC §2.4,
§14.2: the workspace at /home/user, and the cell's /tmp)."""

from __future__ import annotations

import json
import stat
from typing import Any

from sandcell.compat.e2b import cellfiles
from sandcell.compat.e2b.envd.connect import integer
from sandcell.compat.e2b.gateway import Gateway
from sandcell.compat.e2b.paths import to_cell, to_e2b
from sandcell.errors import ErrorCode, ServiceError
from sandcell.store import SandboxRecord

TYPES = {"file": "FILE_TYPE_FILE", "dir": "FILE_TYPE_DIRECTORY", "symlink": "FILE_TYPE_SYMLINK"}
KIND_BITS = {"file": stat.S_IFREG, "dir": stat.S_IFDIR, "symlink": stat.S_IFLNK}


METADATA_PREFIX = "e2b."  # E2B's metadata is `user.e2b.<key>`; the daemon drops `user.`


def e2b_metadata(entry: dict[str, Any]) -> dict[str, str]:
    """E2B's user metadata of a sandcell entry: its `user.e2b.*` xattrs."""
    kept = entry.get("metadata") or {}
    return {k[len(METADATA_PREFIX) :]: v for k, v in kept.items() if k.startswith(METADATA_PREFIX)}


def entry_info(entry: dict[str, Any]) -> dict[str, Any]:
    """An envd EntryInfo for a sandcell entry."""
    mode = int(entry.get("mode", "0"), 8)
    info = {
        "name": entry["name"],
        "type": TYPES.get(entry["type"], "FILE_TYPE_UNSPECIFIED"),
        "path": to_e2b(entry["path"]),
        "size": str(entry.get("size", 0)),
        "mode": mode,
        "permissions": stat.filemode(KIND_BITS.get(entry["type"], 0) | mode),
        "owner": entry.get("owner") or "user",
        "group": entry.get("group") or "user",
        "modifiedTime": entry.get("modified"),
        "isSymlink": entry["type"] == "symlink",
    }
    if entry.get("target") is not None:
        info["symlinkTarget"] = entry["target"]
    metadata = e2b_metadata(entry)
    if metadata:
        info["metadata"] = metadata
    return info


def path_of(message: dict[str, Any], field: str = "path") -> str:
    value = message.get(field)
    if not isinstance(value, str) or not value:
        raise ServiceError(ErrorCode.BAD_REQUEST, f"{field} is required")
    return to_cell(value)


async def _stat(gateway: Gateway, record: SandboxRecord, path: str) -> dict[str, Any]:
    return await cellfiles.json(gateway, record, "GET", "stat", query={"path": path})


async def stat_entry(
    gateway: Gateway, record: SandboxRecord, message: dict[str, Any]
) -> dict[str, Any]:
    return {"entry": entry_info(await _stat(gateway, record, path_of(message)))}


async def make_dir(
    gateway: Gateway, record: SandboxRecord, message: dict[str, Any]
) -> dict[str, Any]:
    path = path_of(message)
    try:
        await _stat(gateway, record, path)
    except ServiceError as exc:
        if exc.code is not ErrorCode.FILE_NOT_FOUND:
            raise
    else:  # envd's answer for a directory that is there already: make_dir() returns False
        raise ServiceError(ErrorCode.CONFLICT, f"{message['path']} already exists")
    body = json.dumps({"path": path, "parents": True}).encode()
    entry = await cellfiles.json(gateway, record, "POST", "mkdir", body=body)
    return {"entry": entry_info(entry)}


async def move(gateway: Gateway, record: SandboxRecord, message: dict[str, Any]) -> dict[str, Any]:
    body = {
        "from": path_of(message, "source"),
        "to": path_of(message, "destination"),
        "overwrite": True,
    }
    entry = await cellfiles.json(gateway, record, "POST", "move", body=json.dumps(body).encode())
    return {"entry": entry_info(entry)}


async def remove(
    gateway: Gateway, record: SandboxRecord, message: dict[str, Any]
) -> dict[str, Any]:
    query = {"path": path_of(message), "recursive": "true"}
    try:
        await cellfiles.send(gateway, record, "DELETE", query=query)
    except ServiceError as exc:  # E2B treats removing what is not there as done
        if exc.code is not ErrorCode.FILE_NOT_FOUND:
            raise
    return {}


async def list_dir(
    gateway: Gateway, record: SandboxRecord, message: dict[str, Any]
) -> dict[str, Any]:
    depth = max(1, integer(message.get("depth"), "depth", 1))
    query = {"path": path_of(message), "depth": str(depth)}
    listed = await cellfiles.json(gateway, record, "GET", "list", query=query)
    return {"entries": [entry_info(e) for e in listed["entries"]]}


UNARY = {
    "Stat": stat_entry,
    "MakeDir": make_dir,
    "Move": move,
    "Remove": remove,
    "ListDir": list_dir,
}
