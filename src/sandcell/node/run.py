"""`sandcell node` (SPEC §18): this host's cells for the cluster's routers.

It runs what `sandcell serve` runs below its router (the store, the local backend with its
egress proxies and substituting TLS, the manager with its warm pools and reaper, the audit
trail), built by the same functions of `sandcell.serve`, and in place of the public API a
node API on mutual TLS (`server`). It registers in the roster before it says it is ready,
heartbeats, and at SIGTERM or SIGINT stops accepting, ends its connections, leaves the roster
and stops the manager: the live sandboxes stay running for the next start to adopt, as with
`serve` (or are deleted, with `--cleanup-on-exit`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import ssl
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from sandcell.cluster import trust
from sandcell.logs import configure as configure_logging
from sandcell.manager.backend import LocalBackend
from sandcell.secrets.metrics import SecretUses
from sandcell.serve import (
    STARTUP_FAILURE,
    audit_trail,
    farewell,
    host_manager,
    opened_backend,
    opened_store,
)
from sandcell.settings import Settings

from .control import Control
from .heartbeat import Capacity, Heartbeat
from .server import NodeApi

log = logging.getLogger("sandcell.node")
DEFAULT_PORT = 8701
DEFAULT_CELLS = 64


@dataclass(frozen=True)
class NodeOptions:
    member_dir: Path  # this node's directory from `sandcell cluster issue --node`
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    advertise: str = ""  # host:port routers dial (default: host:port bound)
    cells: int = DEFAULT_CELLS
    labels: dict[str, str] = field(default_factory=dict)
    log_level: str = "info"
    cleanup_on_exit: bool = False  # delete the live sandboxes at a stop (else adopted next)


async def run_node(settings: Settings, options: NodeOptions) -> None:
    configure_logging(settings.log_format, options.log_level, False)
    if settings.backend != "local":
        log.error("cannot start: a node runs local cells (backend %r)", settings.backend)
        raise SystemExit(STARTUP_FAILURE)
    try:
        context = trust.server_context(options.member_dir, "node")
        name = trust.load_member(options.member_dir, "node").name
    except trust.TrustError as exc:
        log.error("cannot start: %s", exc)  # noqa: TRY400 (a clear line, not a traceback)
        raise SystemExit(STARTUP_FAILURE) from None
    with _signalled() as stopping:
        await _run(settings, options, context, name, stopping)
    log.info("node %s stopped", name)


async def _run(
    settings: Settings,
    options: NodeOptions,
    context: ssl.SSLContext,
    name: str,
    stopping: asyncio.Event,
) -> None:
    uses = SecretUses()
    async with opened_store(settings) as store, opened_backend(settings, store, uses) as backend:
        assert isinstance(backend, LocalBackend)
        manager = await host_manager(settings, store, backend)
        trail = audit_trail(settings, store) if settings.audit.enabled else None
        manager.audit = uses.audit = trail
        if backend.egress is not None and trail is not None:
            backend.egress.on_decision = trail.egress
        api = NodeApi(store, backend, Control(name, manager, backend))
        if trail is not None:
            await trail.start()
        try:
            await manager.start()
            try:
                port = await api.start(options.host, options.port, context)
                heartbeat = Heartbeat(
                    store,
                    backend,
                    settings.templates,
                    name,
                    options.advertise or f"{options.host}:{port}",
                    Capacity.of_host(settings.data_dir, options.cells),
                    options.labels,
                )
                try:
                    await heartbeat.report()
                    heartbeat.start()
                    log.info(
                        "node %s serving routers on %s:%d, in the roster as %s",
                        name,
                        options.host,
                        port,
                        heartbeat.address,
                        extra={"node": name, "port": port},
                    )
                    await stopping.wait()
                    log.info("shutting down: leaving the roster, ending connections")
                finally:
                    await heartbeat.stop()
            finally:
                await api.close()
                await manager.stop()
        finally:
            if trail is not None:
                await trail.close()  # after the manager: its last records go too
        await farewell(manager, options.cleanup_on_exit)


@contextlib.contextmanager
def _signalled() -> Iterator[asyncio.Event]:
    """An event SIGTERM or SIGINT sets, from the very start: a signal while the node starts
    stops it once started, with everything closed in order, never by the default action."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        yield stop
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
