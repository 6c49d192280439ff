"""The state compare-and-set behind pause and resume (SPEC §13), on SQLite and on Redis."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest

from sandcell.store import SandboxRecord

from .helpers import make_sandbox, new_pem

pytestmark = pytest.mark.anyio


def _live(sandbox_id: str) -> SandboxRecord:
    now = time.time()
    return make_sandbox(sandbox_id, expires_at=now + 3600, last_activity_at=now)


async def test_exactly_one_of_many_concurrent_transitions_wins(store):
    await store.put_sandbox(_live("sbx-1"))
    await store.put_session_key("sbx-1", pem := new_pem())
    record = await store.get_sandbox("sbx-1")
    moves = [dataclasses.replace(record, state="pausing", workspace=f"/w/{i}") for i in range(8)]
    won = await asyncio.gather(*(store.transition(m, ("running",)) for m in moves))
    assert won.count(True) == 1
    stored = await store.get_sandbox("sbx-1")
    assert stored.state == "pausing" and stored.workspace == moves[won.index(True)].workspace
    assert await store.get_session_key("sbx-1") == pem  # kept by a transition


async def test_transition_never_creates_and_checks_the_state(store):
    gone = dataclasses.replace(_live("sbx-gone"), state="paused")
    assert not await store.transition(gone, ("running", "pausing"))
    assert await store.get_sandbox("sbx-gone") is None
    await store.put_sandbox(_live("sbx-2"))
    record = await store.get_sandbox("sbx-2")
    assert not await store.transition(dataclasses.replace(record, state="running"), ("paused",))


async def test_paused_sandboxes_hold_no_slot_and_reap_at_their_ttl(store):
    await store.put_sandbox(_live("sbx-3"))
    assert await store.reserve_sandbox("alice", 1) is None
    record = await store.get_sandbox("sbx-3")
    until = time.time() + 100
    paused = dataclasses.replace(
        record, state="paused", paused_at=time.time(), expires_at=until, last_activity_at=until
    )
    assert await store.transition(paused, ("running",))
    slot = await store.reserve_sandbox("alice", 1)
    assert slot is not None
    await store.release_reservation(slot)
    assert await store.due_for_reaping(time.time() + 50, 10) == []
    assert await store.due_for_reaping(until + 1, 10) == ["sbx-3"]
    running = dataclasses.replace(paused, state="running", paused_at=0.0)
    assert await store.transition(running, ("paused",))
    assert await store.reserve_sandbox("alice", 1) is None  # counted again
