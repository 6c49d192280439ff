"""Server settings: one TOML file (all optional) plus command-line overrides (SPEC §4, §8)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandcell.manager.k8s.config import KubernetesConfig, parse_kubernetes
from sandcell.manager.templates import ConfigError, Template, load_config, parse_templates

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8700
BACKENDS = ("local", "kubernetes")
SERVER_KEYS = {
    "backend",
    "host",
    "port",
    "store",
    "max_inflight",
    "max_sandboxes_per_key",
    "log_format",
    "reap_interval_s",
    "init_timeout_s",
}


def default_data_dir() -> Path:
    if env := os.environ.get("SANDCELL_DATA_DIR"):
        return Path(env)
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "sandcell"


@dataclass
class Settings:
    data_dir: Path
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    store_url: str = ""
    max_inflight: int = 512
    max_sandboxes_per_key: int = 100
    log_format: str = "text"
    reap_interval_s: float = 5.0
    init_timeout_s: float = 10.0
    templates: dict[str, Template] = field(default_factory=dict)
    backend: str = "local"
    kubernetes: KubernetesConfig = field(default_factory=KubernetesConfig)

    @property
    def cells_dir(self) -> Path:
        return self.data_dir / "cells"


def load_settings(config: Path | None, data_dir: Path | None) -> Settings:
    raw = load_config(config)
    server: dict[str, Any] = raw.get("server", {})
    unknown = set(server) - SERVER_KEYS
    if unknown:
        raise ConfigError(f"[server]: unknown keys {sorted(unknown)}")
    unknown_tables = set(raw) - {"server", "templates", "kubernetes"}
    if unknown_tables:
        raise ConfigError(f"unknown tables {sorted(unknown_tables)}")
    root = data_dir or default_data_dir()
    settings = Settings(
        data_dir=root,
        host=str(server.get("host", DEFAULT_HOST)),
        port=_int(server, "port", DEFAULT_PORT, 1, 65535),
        store_url=str(server.get("store") or f"sqlite://{root / 'sandcell.db'}"),
        max_inflight=_int(server, "max_inflight", 512, 1, 1_000_000),
        max_sandboxes_per_key=_int(server, "max_sandboxes_per_key", 100, 1, 1_000_000),
        log_format=str(server.get("log_format", "text")),
        reap_interval_s=float(server.get("reap_interval_s", 5.0)),
        init_timeout_s=float(server.get("init_timeout_s", 10.0)),
        templates=parse_templates(raw, config.parent if config else None),
        backend=str(server.get("backend", "local")),
        kubernetes=parse_kubernetes(raw),
    )
    if settings.log_format not in ("text", "json"):
        raise ConfigError("[server] log_format must be 'text' or 'json'")
    if settings.backend not in BACKENDS:
        raise ConfigError(f"[server] backend must be one of {list(BACKENDS)}")
    return settings


def _int(table: dict[str, Any], key: str, default: int, lo: int, hi: int) -> int:
    value = table.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise ConfigError(f"[server] {key} must be an integer in [{lo}, {hi}]")
    return value
