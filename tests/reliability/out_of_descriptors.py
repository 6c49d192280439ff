"""Run as a script: the reaper of a process that has run out of file descriptors.

`python out_of_descriptors.py DAEMON_SOCKET WORKDIR` records a running sandbox whose daemon
listens on DAEMON_SOCKET, then fills this process's descriptor table (a low RLIMIT_NOFILE,
then /dev/null until EMFILE) and runs reaper passes and a warm-pool claim. It prints one JSON
line: what the probe did, which sandboxes the reaper deleted, whether the record survived,
and whether the pool kept its (healthy) cell. A subprocess, so
the test session's own descriptors are never at stake.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import sys
import time
from pathlib import Path

from sandcell import tokens
from sandcell.cellapi import health
from sandcell.manager.backend import CellHandle, LocalBackend
from sandcell.manager.manager import Manager
from sandcell.manager.pool import WarmCell, WarmPool
from sandcell.store import SandboxRecord, Sealer, open_store

HEADROOM = 64


async def _no_new_cells() -> WarmCell:
    raise AssertionError("the pool must not make cells here")


def fill_descriptors() -> list[int]:
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + HEADROOM,) * 2)
    held = []
    try:
        while True:
            held.append(os.open("/dev/null", os.O_RDONLY))
    except OSError:
        return held


async def main(uds: str, workdir: Path) -> dict:
    store = open_store(f"sqlite://{workdir / 'store.db'}", Sealer(os.urandom(32)))
    now = time.time()
    record = SandboxRecord(
        "sbx-alive", "alice", "default", "running", now, now + 3600, 300, now, endpoint={"uds": uds}
    )
    await store.put_sandbox(record)
    backend = LocalBackend(workdir / "cells")
    manager = Manager(store, backend, {}, tokens.generate_p256())
    pool = WarmPool("default", 0, _no_new_cells, backend)
    warm = WarmCell("sbx-warm", CellHandle({"uds": uds}, {}), tokens.generate_p256())
    pool._ready.append(warm)  # the same daemon, as a ready cell of a warm pool
    outcome: dict = {"healthy_before": await health.probe({"uds": uds})}
    held = fill_descriptors()
    try:
        try:
            outcome["probe"] = await health.probe({"uds": uds})
        except health.ProbeInconclusive as exc:
            outcome["probe"] = exc.code.value
        outcome["reaped"] = [await manager.reap_once() for _ in range(3)]
        try:
            await pool.claim()
        except health.ProbeInconclusive as exc:
            outcome["claim"] = exc.code.value
        outcome["still_in_pool"] = len(pool)
    finally:
        for fd in held:
            os.close(fd)
    outcome["record"] = (await store.get_sandbox("sbx-alive")) is not None
    outcome["healthy_after"] = await health.probe({"uds": uds})
    outcome["claimed_after"] = (await pool.claim()) is warm
    await store.close()
    return outcome


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1], Path(sys.argv[2])))))
