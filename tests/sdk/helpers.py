"""Helpers for the SDK and client CLI tests against a real `sandcell serve`."""

from __future__ import annotations

import inspect
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandcell.client import ClientConfig
from sandcell.isolation.cell import LocalCells
from support.server import RunningServer, start_server


def stop_and_clean(server: RunningServer) -> None:
    """Stops the server, then destroys every cell it left: stopping leaves live sandboxes
    running (a restart adopts them), and a test that failed may have left some."""
    server.stop()
    LocalCells(server.data_dir / "cells", cgroup_parent="sandcell").destroy_all()


def served(
    base: Path, warm_pool: int = 0, config_text: str | None = None, tls_ca: Path | None = None
) -> Iterator[RunningServer]:
    """A `sandcell serve` with its data under `base`, for a fixture to yield."""
    server = start_server(
        base / "data", warm_pool=warm_pool, config_text=config_text, tls_ca=tls_ca
    )
    try:
        yield server
    finally:
        stop_and_clean(server)


@dataclass
class Flavour:
    name: str
    cls: Any

    async def __call__(self, value: Any) -> Any:
        return await value if inspect.isawaitable(value) else value

    @asynccontextmanager
    async def sandbox(self, config: ClientConfig, **options: Any) -> AsyncIterator[Any]:
        sbx = await self(self.cls.create(config=config, **options))
        try:
            yield sbx
        finally:
            await self(sbx.kill())
            await self(sbx.close())

    @asynccontextmanager
    async def connected(self, sandbox_id: str, config: ClientConfig) -> AsyncIterator[Any]:
        sbx = await self(self.cls.connect(sandbox_id, config=config))
        try:
            yield sbx
        finally:
            await self(sbx.close())


def daemon_pid(sandbox_id: str) -> int:
    """The host pid of a sandbox's daemon.

    The router never reveals the cell behind a sandbox, but bwrap starts the daemon with
    `SANDCELL_SANDBOX_ID=<id>` in its environment (`--setenv`), which root can read in
    /proc/PID/environ. The daemon is the process whose argv is `python ... -m
    sandcell.daemon`; bwrap's own argv merely mentions it, and commands the daemon runs never
    get SANDCELL_* variables (the env allow-list). So: exact argv element, exact env entry.
    """
    wanted = f"SANDCELL_SANDBOX_ID={sandbox_id}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if b"sandcell.daemon" not in argv or argv[0].endswith(b"bwrap"):
                continue
            if wanted in (proc / "environ").read_bytes().split(b"\0"):
                found.append(int(proc.name))
        except OSError:
            continue
    assert len(found) == 1, f"daemon of {sandbox_id}: {found}"
    return found[0]


def kill_daemon(sandbox_id: str) -> None:
    pid = daemon_pid(sandbox_id)
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return
        if state in ("Z", "X"):
            return
        time.sleep(0.02)
    raise AssertionError(f"daemon {pid} did not die")
