"""Starting the daemon: bind the socket, drop what it no longer needs, then serve."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import socket
import sys
from collections.abc import Sequence

from sandcell.daemon.config import ConfigError, DaemonConfig, load
from sandcell.daemon.exec import spawn, tree
from sandcell.daemon.http.app import create_app
from sandcell.daemon.http.server import Server

_PR_SET_DUMPABLE = 4
# Beside the workspace, what commands may write: scratch space and the usual devices
# (opening /dev/null read-write is a write). Landlock binds the calling thread: this runs
# before the event loop starts any, so every thread of the daemon inherits it.
CELL_SCRATCH = ("/tmp", "/dev/shm", "/dev/null", "/dev/zero", "/dev/full", "/dev/tty",  # noqa: S108
                "/dev/pts")  # fmt: skip
ORPHAN_REAP_INTERVAL_S = 5.0


def bind_socket(config: DaemonConfig) -> socket.socket:
    if config.fd is not None:
        return _inherited_listener(config.fd)
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


def _inherited_listener(fd: int) -> socket.socket:
    """The socket the host bound for us: its file is the host's, not ours to chmod."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError as exc:
        raise ConfigError(f"--fd {fd}: not a socket: {exc}") from exc
    if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
        raise ConfigError(f"--fd {fd}: the socket is not listening")
    sock.set_inheritable(False)
    return sock


def harden_self(config: DaemonConfig) -> None:
    """Same-uid commands must not read the daemon's memory; writes stay in the workspace;
    commands are spawned by a thread confined further (daemon/exec/spawn.py)."""
    # Opened first: once not dumpable, /proc/self is root's; under Landlock, read-only.
    oom_score = spawn.OwnOomScore()
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    tree.become_subreaper()
    if not config.landlock:
        spawn.start(oom_score, None)
        return
    from sandcell.isolation import landlock

    writable = [config.workspace, *CELL_SCRATCH]
    landlock.restrict_self(writable, deny_tcp=config.deny_tcp)

    def confine_commands(daemon_pid: int, spawner_tid: int) -> None:
        from sandcell.isolation import seccomp

        landlock.restrict_self(writable, deny_tcp=config.deny_tcp, require_scoping=True)
        seccomp.guard_daemon(daemon_pid, spawner_tid)

    spawn.start(oom_score, confine_commands)


async def _reap_orphans_forever(app_runner: tree.OrphanSource) -> None:
    while True:
        await asyncio.sleep(ORPHAN_REAP_INTERVAL_S)
        tree.reap_adopted(app_runner.running_pids)


def serve(config: DaemonConfig) -> None:
    sock = bind_socket(config)
    harden_self(config)
    app = create_app(config)
    server = Server(app)

    async def main() -> None:
        # The server sleeps until a signal asks it to stop: no periodic tick across hundreds
        # of idle cells. No `Date` header is sent (the router sets its own).
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        reaper = asyncio.ensure_future(_reap_orphans_forever(app.state.daemon.runner))
        try:
            await server.serve(sock, stop)
        finally:
            reaper.cancel()
            app.state.daemon.contexts.close_all()

    import uvloop

    uvloop.run(main())


def main(argv: Sequence[str] | None = None) -> int:
    try:
        config = load(sys.argv[1:] if argv is None else argv)
        serve(config)
    except ConfigError as exc:
        print(f"sandcell daemon: {exc}", file=sys.stderr)
        return 2
    return 0
