"""Pause, resume, snapshots and fork through the SDK (SPEC §13), with both clients."""

from __future__ import annotations

import pytest

from sandcell.client import ClientConfig, SandboxPausedError, SnapshotInfo
from sdk.helpers import Flavour

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


async def test_pause_resume_and_auto_resume(flavour: Flavour, config: ClientConfig):
    async with flavour.sandbox(config, auto_resume=False) as sbx:
        await flavour(sbx.files.write("a.txt", b"kept"))
        assert (await flavour(sbx.pause())).state == "paused"
        with pytest.raises(SandboxPausedError):
            await flavour(sbx.files.read("a.txt"))
        assert (await flavour(sbx.resume())).state == "running"
        assert await flavour(sbx.files.read("a.txt")) == b"kept"
        await flavour(sbx.pause())
        again = await flavour(flavour.cls.resume(sbx.id, config=config))  # by id
        assert again.id == sbx.id and again.last_info.state == "running"
        await flavour(again.close())
    async with flavour.sandbox(config) as sbx:  # auto_resume: the default
        await flavour(sbx.pause())
        assert (await flavour(sbx.commands.run("echo back"))).stdout == "back\n"


async def test_snapshot_create_from_it_fork_and_list(flavour: Flavour, config: ClientConfig):
    async with flavour.sandbox(config, metadata={"k": "v"}) as sbx:
        await flavour(sbx.files.write("a.txt", b"v1"))
        snap = await flavour(sbx.snapshot(name="first"))
        assert isinstance(snap, SnapshotInfo) and snap.name == "first" and snap.size_bytes > 0
        await flavour(sbx.files.write("a.txt", b"v2"))
        async with flavour.sandbox(config, snapshot=snap.id) as child:
            assert await flavour(child.files.read("a.txt")) == b"v1"
        fork = await flavour(sbx.fork())
        try:
            assert fork.id != sbx.id and fork.last_info.metadata == {"k": "v"}
            assert await flavour(fork.files.read("a.txt")) == b"v2"
        finally:
            await flavour(fork.kill())
            await flavour(fork.close())
        listed = await flavour(flavour.cls.list_snapshots(config=config))
        assert snap.id in [s.id for s in listed]
        assert await flavour(flavour.cls.delete_snapshot(snap.id, config=config)) is True
        assert await flavour(flavour.cls.delete_snapshot(snap.id, config=config)) is False
