"""envd's `filesystem.Filesystem` service on the daemon's cell-wide file table (SPEC §2.4,
§14.2: the workspace at /home/user, and the cell's /tmp)."""

from __future__ import annotations

import json
import posixpath
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


# The cell's one unprivileged user goes by E2B's name for the sandbox's user.
OWNER_NAMES = {"sandbox": "user"}
MAX_LINK_HOPS = 8
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
        "owner": OWNER_NAMES.get(entry.get("owner") or "user", entry.get("owner")),
        "group": OWNER_NAMES.get(entry.get("group") or "user", entry.get("group")),
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


async def followed(
    gateway: Gateway, record: SandboxRecord, entry: dict[str, Any]
) -> dict[str, Any]:
    """`entry`, a symlink followed as envd does: the type of what it finally names, and that
    absolute path as its target. A link out of the files API's reach, dangling or looping
    stays a symlink with its target made absolute."""
    if entry["type"] != "symlink" or entry.get("target") is None:
        return entry
    link, final = to_e2b(entry["path"]), dict(entry)
    for _ in range(MAX_LINK_HOPS):
        target = posixpath.normpath(posixpath.join(posixpath.dirname(link), final["target"]))
        try:
            final = await _stat(gateway, record, to_cell(target))
        except ServiceError:
            return {**entry, "target": target}
        if final["type"] != "symlink" or final.get("target") is None:
            return {**entry, "type": final["type"], "target": target}
        link = target
    return {**entry, "target": target}


async def stat_entry(
    gateway: Gateway, record: SandboxRecord, message: dict[str, Any]
) -> dict[str, Any]:
    entry = await _stat(gateway, record, path_of(message))
    return {"entry": entry_info(await followed(gateway, record, entry))}


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
    return {"entries": [entry_info(await followed(gateway, record, e)) for e in listed["entries"]]}


UNARY = {
    "Stat": stat_entry,
    "MakeDir": make_dir,
    "Move": move,
    "Remove": remove,
    "ListDir": list_dir,
}
