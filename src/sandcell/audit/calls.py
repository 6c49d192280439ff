"""What a call to a sandbox's daemon does, for the audit trail: its action and what it
touched, read from the call's method, daemon path and (small, whole) body as the router core
sends it. Calls that only look (health, process lists, a file's stat, output reads) and the
relay to a user's own server behind a port are not actions and give None.

Only a command's length and digest (or its text with `[audit] commands = "full"`), a path,
a size and a signal name are taken; a body's other fields (a command's stdin and env, a
file's bytes) are never read."""

from __future__ import annotations

import json
import shlex
from typing import Any
from urllib.parse import parse_qs, urlsplit

from sandcell.audit.records import (
    Action,
    CommandMode,
    Touched,
    command_detail,
    file_detail,
    signal_detail,
)

# (method, daemon path) -> action; both the workspace's files (/v1/files) and the cell's
# (/cell/files, E2B's absolute paths) are file actions.
_FILES: dict[tuple[str, str], Action] = {
    ("PUT", ""): "file.write",
    ("GET", ""): "file.read",
    ("DELETE", ""): "file.remove",
    ("GET", "/list"): "file.list",
    ("POST", "/mkdir"): "file.mkdir",
    ("POST", "/move"): "file.move",
}
_PROCESS: dict[tuple[str, str], Action] = {
    ("POST", "signal"): "process.signal",
    ("POST", "stdin"): "process.input",
    ("POST", "stdin/close"): "process.input",
}


def classify(
    method: str,
    target: str,
    body: bytes | None,
    length: int | None,
    mode: CommandMode = "digest",
) -> tuple[Action, Touched] | None:
    """The action of `method target` and what it touched, or None for a call that is not one
    (`length` is a streamed body's declared length)."""
    parts = urlsplit(target)
    path = parts.path
    size = len(body) if body is not None else length
    for prefix in ("/v1/files", "/cell/files"):
        if path == prefix or path.startswith(prefix + "/"):
            action = _FILES.get((method, path[len(prefix) :]))
            return None if action is None else (action, _file(action, parts.query, body, size))
    if path == "/v1/exec" and method == "POST":
        return "exec", _command(_json(body).get("command"), size, mode)
    if path == "/v1/code/run" and method == "POST":
        return "code.run", _command(_json(body).get("code"), size, mode)
    if path == "/v1/processes" and method == "POST":
        return "process.start", _command(_json(body).get("command"), size, mode)
    if path.startswith("/v1/processes/"):
        _, _, rest = path[len("/v1/processes/") :].partition("/")
        if method == "DELETE" and not rest:
            return "process.signal", signal_detail(signal="SIGKILL")
        action = _PROCESS.get((method, rest))
        if action == "process.signal":
            return action, signal_detail(signal=str(_json(body).get("signal", "")))
        if action is not None:
            return action, {"size": size} if size is not None else {}
    return None


def attach(target: str) -> tuple[Action, Touched] | None:
    """A WebSocket session's action: attaching to a process's terminal or output."""
    path = urlsplit(target).path
    if path.startswith("/v1/processes/") and path.endswith("/ws"):
        return "process.attach", {}
    return None


def _file(action: Action, query: str, body: bytes | None, size: int | None) -> Touched:
    path = (parse_qs(query).get("path") or [""])[0]
    if action == "file.move":
        moved = _json(body)
        return {"path": str(moved.get("from", "")), "to": str(moved.get("to", ""))}
    if action == "file.mkdir":
        return file_detail(path=str(_json(body).get("path", "")))
    if action == "file.write":
        return file_detail(path=path, size=size)
    return file_detail(path=path)


def _command(command: Any, size: int | None, mode: CommandMode) -> Touched:
    if isinstance(command, list):
        command = shlex.join(str(part) for part in command)
    if isinstance(command, str):
        return command_detail(command, mode)
    return {} if size is None else {"size": size}  # a streamed or odd body: its size only


def _json(body: bytes | None) -> dict[str, Any]:
    if not body:
        return {}
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}
