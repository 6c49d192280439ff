"""The `[kubernetes]` table of the server's config file."""

from __future__ import annotations

import os
import socket
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sandcell.manager.templates import ConfigError, _describe

# A label value: the manager's name goes on every pod it makes.
_LABEL_VALUE = r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"


def default_manager_id() -> str:
    """Stable across restarts in a StatefulSet (the pod name), so a restarted replica finds
    and reconciles the pods it made."""
    return os.environ.get("SANDCELL_MANAGER_ID") or socket.gethostname().split(".")[0]


class KubernetesConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    namespace: str = Field("sandcell-sandboxes", pattern=_DNS_LABEL)
    image: str = Field("sandcell-daemon:latest", min_length=1)
    image_pull_policy: str = Field("IfNotPresent", pattern="^(Always|IfNotPresent|Never)$")
    runtime_class: str | None = Field(None, pattern=_DNS_LABEL)  # e.g. "gvisor", "kata"
    daemon_port: int = Field(8701, ge=1, le=65535)
    # Where the API server is: a URL (no auth: `kubectl proxy`, tests), else a kubeconfig file
    # (and context), else in-cluster service account, $KUBECONFIG, ~/.kube/config.
    api_server: str | None = Field(None, pattern="^https?://")
    kubeconfig: str | None = None
    context: str | None = None
    manager_id: str = Field(default_factory=default_manager_id, pattern=_LABEL_VALUE)
    ready_timeout_s: float = Field(120.0, gt=0, le=3600)
    # A warm pod may wait this long in its pool before a sandbox's lifetime starts: the pod's
    # activeDeadlineSeconds is the template's max_lifetime_s plus this.
    max_pool_wait_s: int = Field(3600, ge=0, le=2_592_000)


def parse_kubernetes(raw: dict[str, Any]) -> KubernetesConfig:
    table = raw.get("kubernetes", {})
    if not isinstance(table, dict):
        raise ConfigError("[kubernetes] must be a table")
    try:
        return KubernetesConfig(**table)
    except (ValidationError, TypeError) as exc:
        raise ConfigError(f"[kubernetes]: {_describe(exc)}") from None
