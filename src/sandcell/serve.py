"""`sandcell serve`: router + manager in one process; local cells or Kubernetes pods."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import uvicorn
from starlette.types import ASGIApp

from sandcell import telemetry, tokens
from sandcell.audit.trail import AuditTrail
from sandcell.banner import print_banner, store_label
from sandcell.http.guard import guarded_protocol
from sandcell.logs import configure as configure_logging
from sandcell.logs import counted, quiet_repeats
from sandcell.manager.backend import Backend, LocalBackend
from sandcell.manager.images import TemplateImages
from sandcell.manager.manager import Manager, load_bootstrap_key
from sandcell.network.egress import (
    EgressLimits,
    EgressService,
    owner_from_store,
    policy_from_store,
)
from sandcell.network.tls.authority import Authorities
from sandcell.network.tls.substitution import Substitution
from sandcell.network.tls.upstream import upstream_context
from sandcell.router.app import STORE_OUTAGES, Limits, Router, create_app
from sandcell.router.cors import cross_origin
from sandcell.router.network import PreviewHosts
from sandcell.secrets.lookup import bindings_from_store
from sandcell.secrets.metrics import SecretUses
from sandcell.settings import MIB, Settings
from sandcell.store import Sealer, Store, load_store_key, open_store
from sandcell.store import health as store_health


@contextlib.asynccontextmanager
async def opened_store(settings: Settings) -> AsyncIterator[Store]:
    settings.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    store = open_store(settings.store_url, Sealer(load_store_key(settings.data_dir)))
    try:
        yield store
    finally:
        await store.close()


@contextlib.asynccontextmanager
async def opened_backend(
    settings: Settings, store: Store, uses: SecretUses
) -> AsyncIterator[Backend]:
    if settings.backend == "local":
        limits = EgressLimits(
            max_connections_total=settings.egress_max_connections,
            max_connections_per_owner=settings.egress_max_connections_per_key,
        )
        egress = EgressService(
            policy_from_store(store),
            owner_for=owner_from_store(store),
            limits=limits,
            substitution=substitution(settings, store, uses),
        )
        try:
            yield LocalBackend(settings.cells_dir, egress=egress)
        finally:
            await egress.close()
        return
    from sandcell.manager.k8s.backend import KubernetesBackend  # lightkube only when used

    backend = KubernetesBackend(settings.kubernetes, settings.templates)
    try:
        yield backend
    finally:
        await backend.aclose()


def _tls_factory(
    settings: Settings,
) -> Callable[[uvicorn.Config, Callable[[], ssl.SSLContext]], ssl.SSLContext] | None:
    """The listener's TLS context when `[server] tls_cert_file` is set (checked already when
    the configuration was read), for uvicorn to wrap its sockets in."""
    files = settings.tls_files
    if files is None:
        return None
    from sandcell.http.tls import server_context

    return lambda _config, _default: server_context(*files)


def audit_trail(settings: Settings, store: Store) -> AuditTrail:
    """The audit writer of this server (SPEC §20), started and flushed by the app's lifespan
    (not made at all with `[audit] enabled = false`)."""
    audit = settings.audit
    return AuditTrail(
        store,
        audit.writer_for(settings.port),
        commands=audit.commands,
        sink=audit.sink,
        retention=audit.retention(),
    )


def substitution(settings: Settings, store: Store, uses: SecretUses) -> Substitution:
    """The secret-substituting proxy's parts (SPEC §17): the secrets room's bindings, read
    from the store per connection, and its use recorder; CA bundles beside the cells; the
    upstream checked against the host's CAs and `[server] upstream_ca_file`."""
    return Substitution(
        bindings_from_store(store),
        uses,
        Authorities(settings.data_dir / "tls"),
        upstream_context(settings.upstream_ca_file),
    )


KEEP_ALIVE_S = 75
# After SIGTERM or SIGINT, requests in flight get this long to finish; then they are cut.
GRACE_S = 10
STARTUP_FAILURE = 3  # uvicorn's exit code when it cannot start
log = logging.getLogger("sandcell.serve")


@dataclass(frozen=True)
class ServeOptions:
    """What only the command line says about a run (the rest is in `Settings`)."""

    config: Path | None = None  # named in the banner's hint, so keys land in the same store
    log_level: str = "info"
    access_log: bool = True
    cleanup_on_exit: bool = False


class Server(uvicorn.Server):
    """uvicorn's server, announcing itself once bound, with signals left to `serve`: uvicorn
    re-raises a caught SIGTERM once it has stopped, which kills the process before the store is
    closed (a SQLite -wal and -shm file stay behind)."""

    def __init__(self, config: uvicorn.Config, on_started: Callable[[], Awaitable[None]]) -> None:
        super().__init__(config)
        self._on_started = on_started

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            await self._on_started()


def _on_signal(server: Server, sig: signal.Signals) -> None:
    if server.should_exit:
        log.info(
            "%s: already shutting down (at most %.0f s for requests in flight)", sig.name, GRACE_S
        )
        return
    log.info(
        "shutting down (%s): no new connections; requests in flight get up to %.0f s",
        sig.name,
        GRACE_S,
        extra={"signal": sig.name},
    )
    server.should_exit = True


async def farewell(manager: Manager, cleanup: bool) -> None:
    """After the server stopped (the warm pools are drained): say what stays running."""
    try:
        ids = await manager.shutdown(delete_sandboxes=cleanup)
    except Exception as exc:
        log.warning("could not account for live sandboxes at exit: %s", exc)
        return
    if cleanup:
        deleted = counted(len(ids), "sandbox", "sandboxes")
        log.info("deleted %s (--cleanup-on-exit)", deleted, extra={"deleted": len(ids)})
    else:
        log.info(
            "%s running for the next start to adopt",
            counted(len(ids), "sandbox stays", "sandboxes stay"),
            extra={"staying": len(ids)},
        )


async def _bootstrap_key(store: Store, settings: Settings) -> tokens.PrivateKey:
    try:
        return await load_bootstrap_key(store)
    except STORE_OUTAGES as exc:
        unreachable = f"cannot start: the store {store_label(settings)} is unreachable"
        log.error("%s: %s", unreachable, exc)  # noqa: TRY400 (a clear line, not a traceback)
        raise SystemExit(STARTUP_FAILURE) from None


@contextlib.asynccontextmanager
async def _watching(server: Server, store: Store) -> AsyncIterator[None]:
    """While serving: SIGTERM and SIGINT stop the server gracefully; store outages are told."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, _on_signal, server, sig)
    watcher = asyncio.ensure_future(store_health.watch(store))
    try:
        yield
    finally:
        watcher.cancel()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


async def host_manager(settings: Settings, store: Store, backend: Backend) -> Manager:
    """The manager of this host's cells (pools, reaper, persistence), as `sandcell serve` and
    `sandcell node` run it; exits with STARTUP_FAILURE when the store is unreachable."""
    return Manager(
        store,
        backend,
        settings.templates,
        await _bootstrap_key(store, settings),
        init_timeout_s=settings.init_timeout_s,
        reap_interval_s=settings.reap_interval_s,
        images=TemplateImages.under(settings.data_dir) if settings.backend == "local" else None,
        snapshot_quota_bytes=settings.snapshot_quota_mb * MIB,
        max_paused_per_key=settings.max_paused_per_key,
    )


async def serve(settings: Settings, options: ServeOptions | None = None) -> None:
    options = options or ServeOptions()
    configure_logging(settings.log_format, options.log_level, options.access_log)
    with _traced(settings):
        await _serve(settings, options)


@contextlib.contextmanager
def _traced(settings: Settings) -> Iterator[None]:
    """Traces exported while serving when `[telemetry] otlp_endpoint` is set (SPEC §20); the
    spans still queued at the end go out before the process does."""
    if not settings.otlp_endpoint:
        yield
        return
    telemetry.enable(settings.otlp_endpoint)
    try:
        yield
    finally:
        telemetry.disable()


async def _serve(settings: Settings, options: ServeOptions) -> None:
    uses = SecretUses()  # counted in /metrics, kept for the audit trail (SPEC §17)
    async with opened_store(settings) as store, opened_backend(settings, store, uses) as backend:
        manager = await host_manager(settings, store, backend)
        limits = Limits(
            max_inflight=settings.max_inflight,
            max_sandboxes_per_key=settings.max_sandboxes_per_key,
            max_inflight_per_key=settings.max_inflight_per_key,
            max_inflight_anonymous=settings.max_inflight_anonymous,
            max_sessions_per_key=settings.max_sessions_per_key,
            max_sessions=settings.max_sessions,
            body_budget_bytes=settings.body_budget_bytes,
            body_budget_per_key_bytes=settings.body_budget_per_key_bytes,
        )
        trail = audit_trail(settings, store) if settings.audit.enabled else None
        manager.audit = uses.audit = trail
        router = Router(store, manager, limits, audit=trail)
        uses.register(router.metrics.registry)
        if isinstance(backend, LocalBackend) and backend.egress is not None:
            backend.egress.metrics.register(router.metrics.registry)
            backend.egress.on_decision = trail.egress if trail is not None else None
        api = create_app(router)
        app: ASGIApp = (
            PreviewHosts(api, settings.preview_domain) if settings.preview_domain else api
        )
        app = cross_origin(app, settings.cors_origins)
        config = uvicorn.Config(
            app,
            host=settings.host,
            port=settings.port,
            loop="none",  # the caller runs uvloop already (uvicorn sets a loop up only in run())
            http=guarded_protocol(settings.connections),
            ws="wsproto",  # the one WebSocket library, as on the hops behind it
            access_log=False,  # sandcell.access logs requests, with their ids
            log_config=None,  # logs.configure routes uvicorn's records too
            log_level="warning",
            lifespan="on",
            # Longer than any client's idle pool timeout: a server closing an idle keep-alive
            # connection while a client reuses it loses that request (httpx keeps 5 s).
            timeout_keep_alive=KEEP_ALIVE_S,
            timeout_graceful_shutdown=GRACE_S,
            # Each request in a context of its own: a pipelined one would otherwise start in
            # its predecessor's (its caller, its trace).
            reset_contextvars=True,
            ssl_context_factory=_tls_factory(settings),
        )
        quiet_repeats()  # after uvicorn.Config has set up its loggers
        loop_name = type(asyncio.get_running_loop()).__module__.split(".")[0]
        server = Server(config, lambda: print_banner(settings, options.config, loop_name))
        async with _watching(server, store):
            await server.serve()
        if not server.started:  # the manager could not start; uvicorn logged why
            raise SystemExit(STARTUP_FAILURE)
        await farewell(manager, options.cleanup_on_exit)
    log.info("store closed; stopped")
