"""The request and response models of E2B's control API, for /openapi.json: the fields
sandcell reads (the rest of each body is E2B's own).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from sandcell.compat.e2b.control.common import MAX_TIMEOUT_S
from sandcell.compat.e2b.control.snapshots import MAX_FORKS


class NewSandbox(BaseModel):
    """The fields of E2B's NewSandbox that sandcell reads (the rest is E2B's own)."""

    model_config = ConfigDict(extra="allow")
    templateID: str | None = None
    timeout: int | None = Field(None, ge=1, le=MAX_TIMEOUT_S)
    envVars: dict[str, str] | None = None
    metadata: dict[str, str] | None = None
    autoPause: bool | None = None
    autoPauseMemory: bool | None = None
    autoResume: dict[str, bool] | None = None
    allow_internet_access: bool | None = None
    network: dict[str, Any] | None = None
    secure: bool | None = None


class NetworkUpdate(BaseModel):
    """E2B's SandboxNetworkUpdateConfig (allowOut, denyOut, allow_internet_access)."""

    model_config = ConfigDict(extra="allow")
    allowOut: list[str] | None = None
    denyOut: list[str] | None = None
    allow_internet_access: bool | None = None


class Timeout(BaseModel):
    model_config = ConfigDict(extra="allow")
    timeout: int | None = Field(None, ge=1, le=MAX_TIMEOUT_S)


class SnapshotRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str | None = None
    memory: bool | None = None


class ForkRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    timeout: int | None = Field(None, ge=1, le=MAX_TIMEOUT_S)
    count: int | None = Field(None, ge=1, le=MAX_FORKS)


class Created(BaseModel):
    """E2B's Sandbox: what create, connect and resume answer."""

    templateID: str
    sandboxID: str
    clientID: str
    envdVersion: str
    envdAccessToken: str
    trafficAccessToken: str
    domain: str | None


class NewSecret(BaseModel):
    """E2B's NewSecret; `metadata` carries sandcell's `hosts` (and `in`), comma-separated."""

    model_config = ConfigDict(extra="forbid")
    name: str
    value: str = Field(repr=False)
    metadata: dict[str, str] | None = None


class SecretUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    value: str = Field(repr=False)
    metadata: dict[str, str] | None = None


class Secret(BaseModel):
    """E2B's Secret: never the value."""

    secretID: str
    name: str
    currentVersion: int
    metadata: dict[str, str]
    createdAt: str
    updatedAt: str
