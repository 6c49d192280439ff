"""The router's request and response bodies (SPEC §5)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from sandcell.network.policy import MAX_ENTRIES, Mode
from sandcell.network.preview import MAX_EXPIRES_IN_S
from sandcell.secrets.shapes import MAX_SECRETS_PER_SANDBOX, SecretName
from sandcell.store import SandboxRecord, SnapshotRecord, State

MAX_METADATA_ITEMS = 64
SNAPSHOT_ID = r"^snap-[0-9a-f]{16}$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Network(_Strict):
    """An egress policy (SPEC §11); entries are checked one by one, a bad one is named."""

    egress: Mode | None = None
    allow: list[str] = Field(default_factory=list, max_length=MAX_ENTRIES)
    deny: list[str] = Field(default_factory=list, max_length=MAX_ENTRIES)

    def policy(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


class PreviewUrl(_Strict):
    expires_in_s: int = Field(3600, ge=1, le=MAX_EXPIRES_IN_S)


class PreviewUrlResponse(BaseModel):
    url: str
    expires_at: str
    host_url: str | None = None  # with server.preview_domain: the app at its own host's root


class Resources(_Strict):
    """A sandbox's own limits, each at most the template's max_* (SPEC §13)."""

    cpus: float | None = Field(None, gt=0, le=1024)
    memory_mb: int | None = Field(None, ge=16, le=1_048_576)
    disk_mb: int | None = Field(None, ge=16, le=16_777_216)


class CreateSandbox(_Strict):
    template: str = Field("default", min_length=1, max_length=64)
    idle_timeout_s: int | None = Field(None, ge=1, le=604_800)
    max_lifetime_s: int | None = Field(None, ge=1, le=2_592_000)
    env: dict[str, str] = Field(default_factory=dict, max_length=256)
    metadata: dict[str, str] = Field(default_factory=dict, max_length=MAX_METADATA_ITEMS)
    network: Network | None = None  # default: the template's policy
    auto_resume: bool = True  # a proxied request to the paused sandbox resumes it (SPEC §13)
    on_timeout: Literal["delete", "pause"] = "delete"
    snapshot: str | None = Field(None, pattern=SNAPSHOT_ID)  # start on a copy of its workspace
    resources: Resources | None = None
    # The caller's secrets (SPEC §17), each a placeholder in the sandbox's environment.
    secrets: list[SecretName] = Field(default_factory=list, max_length=MAX_SECRETS_PER_SANDBOX)

    @field_validator("secrets")
    @classmethod
    def _distinct(cls, names: list[str]) -> list[str]:
        if len(set(names)) != len(names):
            raise ValueError("secrets names a secret twice")
        return names


class Keepalive(_Strict):
    idle_timeout_s: int | None = Field(None, ge=1, le=604_800)


class Sandbox(BaseModel):
    id: str
    template: str
    state: State
    created_at: str
    expires_at: str
    idle_timeout_s: int
    last_activity_at: str
    metadata: dict[str, str]
    network: dict[str, Any]
    auto_resume: bool
    on_timeout: str
    resources: dict[str, Any]
    paused_at: str | None


class CreateSnapshot(_Strict):
    name: str | None = Field(None, max_length=128)


class Snapshot(BaseModel):
    id: str
    sandbox_id: str
    name: str | None
    template: str
    created_at: str
    size_bytes: int


class SnapshotList(BaseModel):
    snapshots: list[Snapshot]


def snapshot_view(record: SnapshotRecord) -> dict:
    return {
        "id": record.id,
        "sandbox_id": record.sandbox_id,
        "name": record.name or None,
        "template": record.template,
        "created_at": rfc3339(record.created_at),
        "size_bytes": record.size_bytes,
    }


class SandboxList(BaseModel):
    sandboxes: list[Sandbox]


class TemplateList(BaseModel):
    templates: list[dict]


def rfc3339(ts: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


def sandbox_view(record: SandboxRecord) -> dict:
    return {
        "id": record.id,
        "template": record.template,
        "state": record.state,
        "created_at": rfc3339(record.created_at),
        "expires_at": rfc3339(record.expires_at),
        "idle_timeout_s": record.idle_timeout_s,
        "last_activity_at": rfc3339(record.paused_at or record.last_activity_at),
        "metadata": record.metadata,
        "network": record.network,
        "auto_resume": record.auto_resume,
        "on_timeout": record.on_timeout,
        "resources": record.resources,
        "paused_at": rfc3339(record.paused_at) if record.paused_at else None,
    }
