"""Starting the daemon: bind the socket, drop what it no longer needs, then serve."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import socket
import sys
from collections.abc import Sequence

import uvicorn

from sandcell.daemon import processes
from sandcell.daemon.app import create_app
from sandcell.daemon.config import ConfigError, DaemonConfig, load

_PR_SET_DUMPABLE = 4
# Beside the workspace, what commands may write: scratch space and the usual devices
# (opening /dev/null read-write is a write). Landlock binds the calling thread: this runs
# before the event loop starts any.
CELL_SCRATCH = ("/tmp", "/dev/shm", "/dev/null", "/dev/zero", "/dev/full", "/dev/tty",  # noqa: S108
                "/dev/pts")  # fmt: skip
ORPHAN_REAP_INTERVAL_S = 5.0


def bind_socket(config: DaemonConfig) -> socket.socket:
    if config.uds:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(config.uds)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(config.uds)
        os.chmod(config.uds, 0o600)
    else:
        assert config.listen is not None
        host, port = config.listen
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    sock.listen(1024)
    sock.set_inheritable(False)
    return sock


def harden_self(config: DaemonConfig) -> None:
    """Same-uid commands must not read the daemon's memory; writes stay in the workspace."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    processes.become_subreaper()
    if config.landlock:
        from sandcell.isolation import landlock

        landlock.restrict_self([config.workspace, *CELL_SCRATCH], deny_tcp=config.deny_tcp)


async def _reap_orphans_forever(app_runner: processes.OrphanSource) -> None:
    while True:
        await asyncio.sleep(ORPHAN_REAP_INTERVAL_S)
        processes.reap_adopted(app_runner.running_pids)


def serve(config: DaemonConfig) -> None:
    sock = bind_socket(config)
    harden_self(config)
    app = create_app(config)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            loop="uvloop",
            http="httptools",
            lifespan="off",
            access_log=False,
            log_level="warning",
            timeout_keep_alive=75,
        )
    )

    async def main() -> None:
        reaper = asyncio.ensure_future(_reap_orphans_forever(app.state.daemon.runner))
        try:
            await server.serve(sockets=[sock])
        finally:
            reaper.cancel()
            app.state.daemon.contexts.close_all()

    import uvloop

    uvloop.run(main())


def main(argv: Sequence[str] | None = None) -> int:
    try:
        config = load(sys.argv[1:] if argv is None else argv)
    except ConfigError as exc:
        print(f"sandcell daemon: {exc}", file=sys.stderr)
        return 2
    serve(config)
    return 0
