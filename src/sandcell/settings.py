"""Server settings: one TOML file (all optional) plus command-line overrides (SPEC §4, §8)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandcell.audit.settings import AuditConfigError, AuditSettings, parse_audit
from sandcell.http.limits import ConnectionLimits
from sandcell.manager.k8s.config import KubernetesConfig, parse_kubernetes
from sandcell.manager.templates import ConfigError, Template, load_config, parse_templates
from sandcell.telemetry import TelemetryConfigError, check_endpoint

DEFAULT_HOST = "127.0.0.1"
_ORIGIN = re.compile(r"https?://[a-z0-9.-]+(:[0-9]{1,5})?")
_DOMAIN = re.compile(r"(?!-)[a-z0-9-]{1,63}(?<!-)(\.(?!-)[a-z0-9-]{1,63}(?<!-))+")
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
    "preview_domain",
    "header_timeout_s",
    "max_header_bytes",
    "body_timeout_s",
    "min_body_rate",
    "max_connections",
    "max_inflight_per_key",
    "max_inflight_anonymous",
    "max_sessions_per_key",
    "max_sessions",
    "body_budget_bytes",
    "body_budget_per_key_bytes",
    "snapshot_quota_mb",
    "max_paused_per_key",
    "egress_max_connections",
    "egress_max_connections_per_key",
    "cors_origins",
    "upstream_ca_file",
    "tls_cert_file",
    "tls_key_file",
}
MIB = 1_048_576


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
    preview_domain: str = ""  # "{port}-{sandbox id}.{preview_domain}" reaches exposed ports
    connections: ConnectionLimits = field(default_factory=ConnectionLimits)
    max_inflight_per_key: int = 0  # 0: a quarter of max_inflight
    max_inflight_anonymous: int = 0  # keyless callers (preview URLs) together; 0: a quarter
    max_sessions_per_key: int = 64  # WebSocket sessions of one key (or one sandbox's visitors)
    max_sessions: int = 0  # all WebSocket sessions; 0 (and the ceiling): from RLIMIT_NOFILE
    body_budget_bytes: int = 128 * MIB
    body_budget_per_key_bytes: int = 32 * MIB
    snapshot_quota_mb: int = 10_240  # per principal, all its snapshots together (SPEC §13)
    max_paused_per_key: int = 16  # paused (and pausing, resuming) sandboxes of one key
    # Egress proxy connections of every sandbox, and of one principal's: 0 derives them from
    # RLIMIT_NOFILE (`EgressLimits`); a larger value is still held below that ceiling.
    egress_max_connections: int = 0
    egress_max_connections_per_key: int = 0
    cors_origins: tuple[str, ...] = ()  # browser origins allowed to call (E2B's JS SDK in a page)
    # CAs the secret-substituting proxy trusts upstream beyond the host's store (SPEC §17)
    upstream_ca_file: Path | None = None
    audit: AuditSettings = field(default_factory=AuditSettings)  # SPEC §20
    # The router's own listener over TLS: the certificate chain and its key (both, or neither)
    tls_files: tuple[Path, Path] | None = None
    otlp_endpoint: str = ""  # traces exported over OTLP/HTTP there (SPEC §20); "" is off

    @property
    def cells_dir(self) -> Path:
        return self.data_dir / "cells"


def load_settings(config: Path | None, data_dir: Path | None) -> Settings:
    raw = load_config(config)
    server: dict[str, Any] = raw.get("server", {})
    unknown = set(server) - SERVER_KEYS
    if unknown:
        raise ConfigError(f"[server]: unknown keys {sorted(unknown)}")
    unknown_tables = set(raw) - {"server", "templates", "kubernetes", "audit", "telemetry"}
    if unknown_tables:
        raise ConfigError(f"unknown tables {sorted(unknown_tables)}")
    root = (data_dir or default_data_dir()).absolute()  # a relative one would name a URL host
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
        preview_domain=str(server.get("preview_domain", "")).lower().strip("."),
        connections=_connection_limits(server),
        max_inflight_per_key=_int(server, "max_inflight_per_key", 0, 0, 1_000_000),
        max_inflight_anonymous=_int(server, "max_inflight_anonymous", 0, 0, 1_000_000),
        max_sessions_per_key=_int(server, "max_sessions_per_key", 64, 1, 1_000_000),
        max_sessions=_int(server, "max_sessions", 0, 0, 1_000_000),
        body_budget_bytes=_int(server, "body_budget_bytes", 128 * MIB, MIB, 1 << 40),
        snapshot_quota_mb=_int(server, "snapshot_quota_mb", 10_240, 0, 1 << 30),
        max_paused_per_key=_int(server, "max_paused_per_key", 16, 0, 1_000_000),
        body_budget_per_key_bytes=_int(server, "body_budget_per_key_bytes", 32 * MIB, MIB, 1 << 40),
        egress_max_connections=_int(server, "egress_max_connections", 0, 0, 1_000_000),
        egress_max_connections_per_key=_int(
            server, "egress_max_connections_per_key", 0, 0, 1_000_000
        ),
        cors_origins=_origins(server),
        upstream_ca_file=_upstream_ca_file(server, config),
        audit=_audit(raw, config),
        tls_files=_tls_files(server, config),
        otlp_endpoint=_otlp_endpoint(raw),
    )
    if settings.log_format not in ("text", "json"):
        raise ConfigError("[server] log_format must be 'text' or 'json'")
    if settings.preview_domain and not _DOMAIN.fullmatch(settings.preview_domain):
        raise ConfigError("[server] preview_domain must be a DNS name, e.g. preview.example.com")
    if settings.backend not in BACKENDS:
        raise ConfigError(f"[server] backend must be one of {list(BACKENDS)}")
    return settings


def _tls_files(server: dict[str, Any], config: Path | None) -> tuple[Path, Path] | None:
    """The listener's certificate and key, relative to the config file's directory; both or
    neither, checked now (`http.tls.server_context`)."""
    cert, key = server.get("tls_cert_file"), server.get("tls_key_file")
    if cert is None and key is None:
        return None
    if not isinstance(cert, str) or not cert or not isinstance(key, str) or not key:
        raise ConfigError("[server] tls_cert_file and tls_key_file go together, each a path")
    from sandcell.http.tls import ServerTLSError, server_context

    base = config.parent if config is not None else Path()
    files = (base / cert, base / key)
    try:
        server_context(*files)
    except ServerTLSError as exc:
        raise ConfigError(str(exc)) from None
    return files


def _audit(raw: dict[str, Any], config: Path | None) -> AuditSettings:
    table = raw.get("audit", {})
    if not isinstance(table, dict):
        raise ConfigError("[audit] must be a table")
    try:
        return parse_audit(table, config.parent if config else None)
    except AuditConfigError as exc:
        raise ConfigError(str(exc)) from exc


def _otlp_endpoint(raw: dict[str, Any]) -> str:
    table = raw.get("telemetry", {})
    if not isinstance(table, dict):
        raise ConfigError("[telemetry] must be a table")
    if unknown := set(table) - {"otlp_endpoint"}:
        raise ConfigError(f"[telemetry]: unknown keys {sorted(unknown)}")
    if "otlp_endpoint" not in table:
        return ""
    try:
        return check_endpoint(table["otlp_endpoint"])
    except TelemetryConfigError as exc:
        raise ConfigError(str(exc)) from None


def _origins(server: dict[str, Any]) -> tuple[str, ...]:
    origins = server.get("cors_origins", [])
    if not isinstance(origins, list) or not all(isinstance(o, str) for o in origins):
        raise ConfigError(
            '[server] cors_origins must be a list of origins, e.g. ["https://app.example.com"]'
        )
    for origin in origins:
        if origin == "*":
            raise ConfigError(
                "[server] cors_origins: '*' is refused; "
                "name each origin whose pages may call sandcell"
            )
        if not _ORIGIN.fullmatch(origin):
            raise ConfigError(
                f"[server] cors_origins: {origin!r} is not an origin "
                "(scheme://host[:port], lower case, no path)"
            )
    return tuple(origins)


def _upstream_ca_file(server: dict[str, Any], config: Path | None) -> Path | None:
    """A PEM file of CAs, relative to the config file's directory; checked now, so a server
    that could not verify its upstreams does not start."""
    value = server.get("upstream_ca_file")
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ConfigError("[server] upstream_ca_file must be the path of a PEM file of CAs")
    from sandcell.network.tls.upstream import UpstreamCAError, check_ca_file

    path = Path(value) if config is None else config.parent / value
    try:
        return check_ca_file(path)
    except UpstreamCAError as exc:
        raise ConfigError(str(exc)) from None


def _int(table: dict[str, Any], key: str, default: int, lo: int, hi: int) -> int:
    value = table.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise ConfigError(f"[server] {key} must be an integer in [{lo}, {hi}]")
    return value


def _connection_limits(server: dict[str, Any]) -> ConnectionLimits:
    defaults = ConnectionLimits()
    return ConnectionLimits(
        header_timeout_s=_seconds(server, "header_timeout_s", defaults.header_timeout_s),
        max_header_bytes=_int(server, "max_header_bytes", defaults.max_header_bytes, 4096, 1 << 24),
        body_timeout_s=_seconds(server, "body_timeout_s", defaults.body_timeout_s),
        min_body_rate=_int(server, "min_body_rate", defaults.min_body_rate, 1, 1 << 40),
        max_connections=_int(server, "max_connections", defaults.max_connections, 0, 1_000_000),
    )


def _seconds(table: dict[str, Any], key: str, default: float) -> float:
    value = table.get(key, default)
    if not isinstance(value, int | float) or isinstance(value, bool) or not 0 < value <= 3600:
        raise ConfigError(f"[server] {key} must be a number of seconds in (0, 3600]")
    return float(value)
