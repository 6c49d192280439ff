"""The manager end to end: real cells, real SQLite and Redis stores."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from sandcell import tokens
from sandcell.cellapi.client import DaemonClient
from sandcell.errors import ServiceError
from sandcell.manager.backend import LocalBackend
from sandcell.manager.init import InitFailed
from support.cells import kill_daemon
from support.sessions import session_client

pytestmark = pytest.mark.anyio


def _cell_dirs(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "cells").iterdir())


async def test_create_exec_delete(make_manager, tmp_path):
    manager = await make_manager()
    await manager.start()
    record = await manager.create_sandbox("alice", env={"GREETING": "hi"}, metadata={"k": "v"})
    assert record.state == "running" and record.owner == "alice"
    with await session_client(manager, record.id) as client:
        assert client.exec("echo $GREETING $(id -u)")["stdout"] == "hi 1000\n"
    assert await manager.delete_sandbox(record.id) is True
    assert await manager.store.get_sandbox(record.id) is None
    assert await manager.store.get_session_key(record.id) is None
    assert _cell_dirs(tmp_path) == []
    assert await manager.delete_sandbox(record.id) is False
    await manager.stop()


async def test_unknown_template_is_bad_request(make_manager):
    manager = await make_manager()
    with pytest.raises(ServiceError) as info:
        await manager.create_sandbox("alice", "nope")
    assert info.value.status == 400


async def test_warm_pool_claim_refill_and_health(make_manager, tmp_path, cgroup_parent):
    manager = await make_manager(default={"warm_pool": 2})
    await manager.start()
    pool = manager.pools["default"]
    await pool.wait_full(30)
    # A pooled cell whose daemon died is never handed out.
    dead = pool._ready[0]
    kill_daemon(cgroup_parent, dead.handle.cell["cell_id"])
    started = time.monotonic()
    record = await manager.create_sandbox("alice")
    claim_s = time.monotonic() - started
    assert record.id != dead.sandbox_id
    with await session_client(manager, record.id) as client:
        assert client.exec("echo warm")["stdout"] == "warm\n"
    assert claim_s < 1.0, claim_s  # no cold start on the claim path
    await pool.wait_full(30)
    assert len(pool) == 2
    await manager.stop()
    assert [d for d in _cell_dirs(tmp_path)] == [record.cell["cell_id"]]
    await manager.delete_sandbox(record.id)


class PreInitialisedBackend(LocalBackend):
    """Hands out cells whose daemon already accepted someone else's session key."""

    def __init__(self, cells_dir: Path, cgroup_parent: str, bootstrap_key) -> None:
        super().__init__(cells_dir, cgroup_parent)
        self.bootstrap_key = bootstrap_key

    async def create(self, policy, sandbox_id, bootstrap_pem, workspace=None):
        handle = await super().create(policy, sandbox_id, bootstrap_pem, workspace)
        foreign = tokens.mint_bootstrap_token(
            self.bootstrap_key, sandbox_id, tokens.public_pem(tokens.generate_p256())
        )
        with DaemonClient(handle.endpoint, sandbox_id) as c:
            assert c.init(foreign).status_code == 200
        return handle


async def test_init_conflict_is_failure_and_cleans_up(make_manager, tmp_path, cgroup_parent):
    manager = await make_manager()
    manager.backend = PreInitialisedBackend(
        tmp_path / "cells", cgroup_parent, manager.bootstrap_key
    )
    with pytest.raises(InitFailed, match="409"):
        await manager.create_sandbox("alice")
    assert manager.init_failures == 1
    assert _cell_dirs(tmp_path) == []
    assert await manager.store.list_sandboxes() == []


async def test_init_with_wrong_bootstrap_key_fails_fast(make_manager, tmp_path):
    manager = await make_manager()
    manager.bootstrap_key = tokens.generate_p256()  # the daemons trust another public key
    started = time.monotonic()
    with pytest.raises(InitFailed, match="401"):
        await manager.create_sandbox("alice")
    assert time.monotonic() - started < 5
    assert _cell_dirs(tmp_path) == []


async def test_reaper_idle_lifetime_and_dead_daemons(make_manager, tmp_path, cgroup_parent):
    manager = await make_manager()
    idle = await manager.create_sandbox("alice", idle_timeout_s=1)
    old = await manager.create_sandbox("alice", max_lifetime_s=30, idle_timeout_s=100)
    dead = await manager.create_sandbox("alice")
    live = await manager.create_sandbox("alice")
    kill_daemon(cgroup_parent, dead.cell["cell_id"])
    await manager.store.touch(live.id, time.time() + 1.5)
    reaped = await manager.reap_once(time.time() + 1.5)
    assert reaped == [idle.id]  # one failed probe is not yet a death
    reaped = await manager.reap_once(time.time() + 31)
    assert set(reaped) == {old.id, dead.id}
    assert [r.id for r in await manager.store.list_sandboxes()] == [live.id]
    assert _cell_dirs(tmp_path) == [live.cell["cell_id"]]
    await manager.delete_sandbox(live.id)


async def test_restart_adopts_live_and_cleans_dead(make_manager, tmp_path, cgroup_parent):
    first = await make_manager(default={"warm_pool": 1})
    await first.start()
    live = await first.create_sandbox("alice")
    dead = await first.create_sandbox("bob")
    await first.pools["default"].wait_full(30)
    kill_daemon(cgroup_parent, dead.cell["cell_id"])
    # The first manager "crashes": no stop(), its pool cell is now nobody's.
    second = await make_manager()
    report = await second.reconcile()
    assert report["adopted"] == [live.id]
    assert report["dropped"] == [dead.id]
    assert len(report["orphans"]) == 1
    with await session_client(second, live.id) as client:  # the session key still decrypts
        assert client.exec("echo survived")["stdout"] == "survived\n"
    assert _cell_dirs(tmp_path) == [live.cell["cell_id"]]
    await second.delete_sandbox(live.id)
    assert _cell_dirs(tmp_path) == []


async def test_concurrent_deletes_and_reaper_race(make_manager, tmp_path, cgroup_parent):
    import asyncio

    manager = await make_manager()
    record = await manager.create_sandbox("alice")
    kill_daemon(cgroup_parent, record.cell["cell_id"])
    results = await asyncio.gather(
        *(manager.delete_sandbox(record.id) for _ in range(3)),
        manager.reap_once(),
        manager.reap_once(),
    )
    assert sorted(results[:3]) == [False, False, True]
    assert _cell_dirs(tmp_path) == []
