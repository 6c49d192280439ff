"""What the API returns, as small immutable objects (parsed once, here)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sandcell.client.errors import InvalidResponseError


def _time(value: Any) -> datetime:
    try:
        return datetime.fromisoformat(str(value))
    except ValueError:
        raise InvalidResponseError(f"not an RFC 3339 timestamp: {value!r}") from None


def list_in(data: Any, key: str) -> list[Any]:
    """The list a reply holds under `key` (`{"sandboxes": [...]}` and its like)."""
    items = data.get(key) if isinstance(data, Mapping) else None
    if not isinstance(items, list):
        raise InvalidResponseError(f"unexpected reply, wanted a list in {key!r}")
    return items


def _fields(data: Any, *names: str) -> Mapping[str, Any]:
    if not isinstance(data, Mapping) or any(n not in data for n in names):
        raise InvalidResponseError(f"unexpected reply, wanted fields {list(names)}: {data!r:.200}")
    return data


@dataclass(frozen=True)
class SandboxInfo:
    id: str
    template: str
    state: str
    created_at: datetime
    expires_at: datetime
    idle_timeout_s: int
    last_activity_at: datetime
    metadata: dict[str, str] = field(default_factory=dict)
    network: dict[str, Any] = field(default_factory=dict)  # the egress policy in force
    auto_resume: bool = True
    on_timeout: str = "delete"
    resources: dict[str, Any] = field(default_factory=dict)  # the create's own limits

    @classmethod
    def from_dict(cls, data: Any) -> SandboxInfo:
        d = _fields(data, "id", "template", "state", "created_at", "expires_at")
        return cls(
            id=str(d["id"]),
            template=str(d["template"]),
            state=str(d["state"]),
            created_at=_time(d["created_at"]),
            expires_at=_time(d["expires_at"]),
            idle_timeout_s=int(d.get("idle_timeout_s") or 0),
            last_activity_at=_time(d.get("last_activity_at") or d["created_at"]),
            metadata=dict(d.get("metadata") or {}),
            network=dict(d.get("network") or {}),
            auto_resume=bool(d.get("auto_resume", True)),
            on_timeout=str(d.get("on_timeout") or "delete"),
            resources=dict(d.get("resources") or {}),
        )

    def to_dict(self) -> dict[str, Any]:
        """The API's JSON shape (timestamps in RFC 3339)."""
        return {
            "id": self.id,
            "template": self.template,
            "state": self.state,
            "created_at": _rfc3339(self.created_at),
            "expires_at": _rfc3339(self.expires_at),
            "idle_timeout_s": self.idle_timeout_s,
            "last_activity_at": _rfc3339(self.last_activity_at),
            "metadata": dict(self.metadata),
            "network": dict(self.network),
            "auto_resume": self.auto_resume,
            "on_timeout": self.on_timeout,
            "resources": dict(self.resources),
        }


@dataclass(frozen=True)
class EntryInfo:
    """A file, directory or symlink in the workspace; `path` is workspace-relative."""

    name: str
    path: str
    type: str
    size: int
    mode: str
    modified: datetime

    @property
    def is_dir(self) -> bool:
        return self.type == "dir"

    @property
    def is_file(self) -> bool:
        return self.type == "file"

    @classmethod
    def from_dict(cls, data: Any) -> EntryInfo:
        d = _fields(data, "name", "path", "type", "size", "mode", "modified")
        return cls(
            name=str(d["name"]),
            path=str(d["path"]),
            type=str(d["type"]),
            size=int(d["size"]),
            mode=str(d["mode"]),
            modified=_time(d["modified"]),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "path": self.path,
            "type": self.type,
            "size": self.size,
            "mode": self.mode,
            "modified": _rfc3339(self.modified),
        }


@dataclass(frozen=True)
class CommandResult:
    """A finished command. `exit_code` is 124 on timeout and 128+N when killed by signal N."""

    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False
    signal: int | None = None
    duration_s: float = 0.0
    stdout_truncated: bool = False
    stderr_truncated: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @classmethod
    def from_dict(cls, data: Any) -> CommandResult:
        d = _fields(data, "exit_code")
        return cls(
            exit_code=int(d["exit_code"]),
            stdout=str(d.get("stdout") or ""),
            stderr=str(d.get("stderr") or ""),
            timed_out=bool(d.get("timed_out")),
            signal=None if d.get("signal") is None else int(d["signal"]),
            duration_s=float(d.get("duration_s") or 0.0),
            stdout_truncated=bool(d.get("stdout_truncated")),
            stderr_truncated=bool(d.get("stderr_truncated")),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "exit_code": self.exit_code,
            "stdout": self.stdout,
            "stderr": self.stderr,
            "timed_out": self.timed_out,
            "signal": self.signal,
            "duration_s": self.duration_s,
            "stdout_truncated": self.stdout_truncated,
            "stderr_truncated": self.stderr_truncated,
        }


def _rfc3339(ts: datetime) -> str:
    return ts.isoformat().replace("+00:00", "Z")


@dataclass(frozen=True)
class ProcessInfo:
    """A background process (running, or among the last that exited); `pid` is the cell's."""

    pid: int
    command: str | list[str]
    cwd: str
    pty: bool
    started_at: datetime
    state: str
    tag: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    timed_out: bool = False

    @property
    def running(self) -> bool:
        return self.state == "running"

    @classmethod
    def from_dict(cls, data: Any) -> ProcessInfo:
        d = _fields(data, "pid", "command", "started_at", "state")
        command = d["command"]
        return cls(
            pid=int(d["pid"]),
            command=[str(a) for a in command] if isinstance(command, list) else str(command),
            cwd=str(d.get("cwd") or "."),
            pty=bool(d.get("pty")),
            started_at=_time(d["started_at"]),
            state=str(d["state"]),
            tag=None if d.get("tag") is None else str(d["tag"]),
            exit_code=None if d.get("exit_code") is None else int(d["exit_code"]),
            signal=None if d.get("signal") is None else int(d["signal"]),
            timed_out=bool(d.get("timed_out")),
        )


@dataclass(frozen=True)
class SandboxMetrics:
    """What a sandbox uses now; a figure the backend cannot read is None."""

    cpu_used_s: float | None
    cpu_percent: float | None
    cpus: float
    memory_bytes: int | None
    memory_limit_bytes: int
    pids: int | None
    pids_limit: int
    disk_used_bytes: int
    disk_limit_bytes: int
    at: datetime

    @classmethod
    def from_dict(cls, data: Any) -> SandboxMetrics:
        d = _fields(data, "cpus", "memory_limit_bytes", "pids_limit", "disk_limit_bytes", "at")

        def maybe(name: str, kind: type[Any]) -> Any:
            return None if d.get(name) is None else kind(d[name])

        return cls(
            cpu_used_s=maybe("cpu_used_s", float),
            cpu_percent=maybe("cpu_percent", float),
            cpus=float(d["cpus"]),
            memory_bytes=maybe("memory_bytes", int),
            memory_limit_bytes=int(d["memory_limit_bytes"]),
            pids=maybe("pids", int),
            pids_limit=int(d["pids_limit"]),
            disk_used_bytes=int(d.get("disk_used_bytes") or 0),
            disk_limit_bytes=int(d["disk_limit_bytes"]),
            at=_time(d["at"]),
        )


@dataclass(frozen=True)
class SnapshotInfo:
    """A copy of a sandbox's workspace (files only: memory is not kept)."""

    id: str
    sandbox_id: str
    name: str | None
    template: str
    created_at: datetime
    size_bytes: int

    @classmethod
    def from_dict(cls, data: Any) -> SnapshotInfo:
        d = _fields(data, "id", "sandbox_id", "template", "created_at", "size_bytes")
        return cls(
            id=str(d["id"]),
            sandbox_id=str(d["sandbox_id"]),
            name=None if d.get("name") is None else str(d["name"]),
            template=str(d["template"]),
            created_at=_time(d["created_at"]),
            size_bytes=int(d["size_bytes"]),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "sandbox_id": self.sandbox_id,
            "name": self.name,
            "template": self.template,
            "created_at": _rfc3339(self.created_at),
            "size_bytes": self.size_bytes,
        }
