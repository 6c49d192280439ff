"""A one-route app that forwards `/v1/sandboxes/{id}/{rest}` through the core's `Hop` and its
HTTP adapter, and a client of it served in-process: the hop's logic without a router."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sandcell import tokens
from sandcell.cellapi.environment import DEFAULT_INHERIT
from sandcell.daemon.config import DaemonConfig
from sandcell.daemon.exec import spawn
from sandcell.daemon.http.app import create_app as daemon_app
from sandcell.http.errors import EXCEPTION_HANDLERS
from sandcell.http.hop import check_path
from sandcell.router.core import Hop
from sandcell.router.proxy import call_of, respond, sandbox_target
from sandcell.store import SandboxRecord, Sealer, Store, open_store


def start_unconfined_spawner() -> None:
    """The daemon's spawner thread, unconfined (a test process is not a cell); once a process."""
    with contextlib.suppress(RuntimeError):  # already running in this process
        spawn.start(spawn.OwnOomScore(), confine=None)


def in_process_daemon(sandbox_id: str, workspace: Path, bootstrap: tokens.PrivateKey) -> Starlette:
    """A daemon app of its own for `sandbox_id`, trusting `bootstrap`, on `workspace`."""
    config = DaemonConfig(
        sandbox_id=sandbox_id,
        bootstrap_key=tokens.load_public_key(tokens.public_pem(bootstrap)),
        workspace=str(workspace),
        uds=None,
        listen=("127.0.0.1", 0),
        fd=None,
        inherit_env=DEFAULT_INHERIT,
        disk_quota_bytes=8 << 20,
        landlock=False,
        deny_tcp=False,
    )
    return daemon_app(config, environ={})


@contextlib.asynccontextmanager
async def stored(
    root: Path, record: SandboxRecord, session: tokens.PrivateKey
) -> AsyncIterator[Store]:
    """A SQLite store under `root` holding `record` and its session key."""
    async with open_store(f"sqlite://{root}/store.db", Sealer(b"k" * 32)) as store:
        await store.put_sandbox(record)
        await store.put_session_key(record.id, tokens.private_pem(session))
        yield store


def sandbox_record(sandbox_id: str, endpoint: dict[str, Any]) -> SandboxRecord:
    now = time.time()
    return SandboxRecord(
        sandbox_id, "me", "default", "running", now, now + 60, 60, now, endpoint=endpoint
    )


def forwarding_app(proxy: Hop, record: SandboxRecord) -> Starlette:
    async def forward(request: Request) -> Response:
        check_path(request.path_params["rest"])
        target = sandbox_target(request, f"/v1/sandboxes/{record.id}/")
        return respond(await proxy.exchange(record, await call_of(request, target)))

    route = Route("/v1/sandboxes/{sandbox_id}/{rest:path}", forward, methods=["GET", "POST", "PUT"])
    return Starlette(routes=[route], exception_handlers=EXCEPTION_HANDLERS)


@contextlib.asynccontextmanager
async def proxy_client(proxy: Hop, record: SandboxRecord) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(forwarding_app(proxy, record))
    async with httpx.AsyncClient(transport=transport, base_url="http://router") as client:
        yield client


class InLoopServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # the test runner's signals stay its own


@contextlib.asynccontextmanager
async def served(app: Starlette, uds: Path) -> AsyncIterator[None]:
    """`app` served by uvicorn on `uds`, in this event loop."""
    config = uvicorn.Config(
        app,
        uds=str(uds),
        loop="none",
        lifespan="off",
        log_level="warning",
        timeout_graceful_shutdown=1,
    )
    server = InLoopServer(config)
    task = asyncio.ensure_future(server.serve())
    while not server.started:
        await asyncio.sleep(0.005)
    try:
        yield
    finally:
        server.should_exit = True
        await task
        uds.unlink(missing_ok=True)
