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
