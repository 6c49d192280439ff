"""What `sandcell serve` tells its operator at start: where it listens, what it enforces, and
what a newcomer does next. Facts only, each on its own line with its value as a log field."""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
from pathlib import Path

from sandcell import __version__
from sandcell.isolation.probe import LayerReport, probe_host
from sandcell.manager.templates import Template
from sandcell.settings import Settings, default_data_dir

log = logging.getLogger("sandcell.serve")


def listen_url(settings: Settings) -> str:
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    scheme = "https" if settings.tls_files is not None else "http"
    return f"{scheme}://{host}:{settings.port}"


def store_label(settings: Settings) -> str:
    """The store URL without a password (a Redis URL may carry one)."""
    scheme, sep, rest = settings.store_url.partition("://")
    credentials, at, location = rest.rpartition("@")
    if not at or ":" not in credentials:
        return settings.store_url
    return f"{scheme}{sep}{credentials.split(':', 1)[0]}:***@{location}"


def tell_isolation(reports: list[LayerReport], templates: dict[str, Template]) -> None:
    missing = [r for r in reports if not r.available]
    names = ", ".join(r.layer for r in reports if r.available)
    if not missing:
        log.info("  isolation  all layers enforced: %s", names, extra={"isolation": "enforced"})
        return
    log.warning(
        "  isolation  DEGRADED: %s missing; enforced: %s (details: sandcell doctor)",
        ", ".join(r.layer for r in missing),
        names or "none",
        extra={"isolation": "degraded", "missing": [r.layer for r in missing]},
    )
    for report in missing:
        lax = sorted(n for n, t in templates.items() if report.layer in t.allow_degraded)
        strict = sorted(set(templates) - set(lax))
        log.warning(
            "  isolation  %s is NOT enforced on this host (%s): templates %s run WITHOUT it "
            "(allow_degraded); templates %s refuse to start (503 ISOLATION_UNAVAILABLE)",
            report.layer,
            report.detail,
            lax or "none",
            strict or "none",
        )


def keys_command(settings: Settings, config: Path | None) -> str:
    """How to make a key for this very server (same store: same data dir and config)."""
    argv = ["sandcell", "keys", "create", "NAME"]
    if settings.data_dir != default_data_dir():
        argv += ["--data-dir", str(settings.data_dir)]
    return shlex.join(argv + (["--config", str(config)] if config else []))


async def print_banner(settings: Settings, config: Path | None, loop_name: str) -> None:
    url = listen_url(settings)
    log.info(
        "sandcell %s listening on %s (pid %d, %s)",
        __version__,
        url,
        os.getpid(),
        loop_name,
        extra={"version": __version__, "url": url},
    )
    if settings.backend == "local":
        log.info("  backend    local cells in %s", settings.cells_dir, extra={"backend": "local"})
    else:
        log.info("  backend    Kubernetes pods", extra={"backend": settings.backend})
    log.info(
        "  store      %s (data dir %s)",
        store_label(settings),
        settings.data_dir,
        extra={"store": store_label(settings), "data_dir": str(settings.data_dir)},
    )
    if settings.backend == "local":
        tell_isolation(await asyncio.to_thread(probe_host), settings.templates)
    else:
        log.info("  isolation  enforced by the cluster's pods (docs/kubernetes.md)")
    pools = {name: t.warm_pool for name, t in settings.templates.items()}
    log.info(
        "  templates  %s",
        ", ".join(f"{name} (warm pool {size})" for name, size in pools.items()),
        extra={"warm_pools": pools},
    )
    log.info("  next       an API key: %s", keys_command(settings, config))
    log.info("  next       the API: %s/openapi.json", url, extra={"openapi": f"{url}/openapi.json"})
