"""Pause and resume (SPEC §13): a sandbox's workspace outlives its cell.

Every move is a compare-and-set of the record's state in the store (`Store.transition`), so of
two replicas pausing or resuming one sandbox exactly one does the work. The workspace is never
in two places nor in none: a cell told to keep it (`Backend.keep_workspace`) moves it to its
home when destroyed, and a resumed cell takes it from there and gives it back the same way.
So a crash anywhere leaves a record in `pausing` or `resuming` with the workspace either in a
cell or at home, and `settle` finishes the move: both end `paused`.

A paused sandbox holds no cell but keeps its workspace on the server's disk, up to its whole
`disk_mb`, for its paused TTL: so each key may keep at most `max_paused_per_key` of them (the
manager's setting). The store counts and moves in one step (`Store.start_pause`), so pauses
racing on several replicas cannot overshoot it; a pause past it is a 409 that leaves the
sandbox running.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import TYPE_CHECKING

from sandcell import tokens
from sandcell.audit.trail import recorded
from sandcell.errors import ErrorCode, ServiceError
from sandcell.network.environment import proxy_env
from sandcell.network.policy import parse_policy
from sandcell.store import SandboxRecord

if TYPE_CHECKING:
    from sandcell.manager.manager import Manager

MOVING = ("pausing", "resuming", "snapshotting")  # someone is at work on the sandbox
SETTLE_POLL_S = 0.05
SETTLE_GRACE_S = 30.0  # beyond the init timeout: how long a resume by another caller may take


class Persistence:
    def __init__(self, manager: Manager) -> None:
        self.m = manager

    async def _get(self, sandbox_id: str) -> SandboxRecord:
        record = await self.m.store.get_sandbox(sandbox_id)
        if record is None:
            raise ServiceError(ErrorCode.SANDBOX_NOT_FOUND, f"sandbox {sandbox_id} not found")
        return record

    async def settled(self, sandbox_id: str) -> SandboxRecord:
        """The record once no pause, resume or snapshot (by any replica) is under way."""
        deadline = time.monotonic() + self.m.init_timeout_s + SETTLE_GRACE_S
        while True:
            record = await self._get(sandbox_id)
            if record.state not in MOVING or time.monotonic() > deadline:
                return record
            await asyncio.sleep(SETTLE_POLL_S)

    async def hold(self, sandbox_id: str) -> SandboxRecord:
        """Takes a running or paused sandbox for a snapshot: no pause, resume or other
        snapshot starts until `release` (`paused_at` tells which state it goes back to)."""
        while True:
            record = await self.settled(sandbox_id)
            if record.state not in ("running", "paused"):
                raise _conflict(record)
            held = dataclasses.replace(record, state="snapshotting")
            if await self.m.store.transition(held, (record.state,)):
                return held

    async def release(self, held: SandboxRecord) -> None:
        back = dataclasses.replace(held, state="paused" if held.paused_at else "running")
        await self.m.store.transition(back, ("snapshotting",))

    async def pause(self, sandbox_id: str) -> SandboxRecord:
        """Ends every process and releases the cell; the workspace is kept. Idempotent."""
        with recorded(self.m.audit, "sandbox.pause", sandbox_id):
            return await self._pause(sandbox_id)

    async def _pause(self, sandbox_id: str) -> SandboxRecord:
        while True:
            record = await self.settled(sandbox_id)
            if record.state == "paused":
                return record
            if record.state != "running":
                raise _conflict(record)
            home = self.m.backend.workspace_home(record.id)  # 501 where nothing is kept
            pausing = dataclasses.replace(record, state="pausing", workspace=home)
            started = await self.m.store.start_pause(pausing, self.m.max_paused_per_key)
            if started == "full":
                raise paused_limit(record, self.m.max_paused_per_key)
            if started == "moved":
                return await self.settle_pause(pausing)

    async def settle_pause(self, record: SandboxRecord) -> SandboxRecord:
        """Finishes a pause (also one cut short by a crash): the cell goes, the workspace
        home, the record `paused`, deleted after the template's paused_ttl_s."""
        await self.m.backend.keep_workspace(record.cell, record.workspace)
        await self.m.backend.destroy(record.cell)
        now = time.time()
        ttl = self.m.template(record.template).paused_ttl_s
        paused = dataclasses.replace(
            record,
            state="paused",
            endpoint={},
            paused_at=now,
            expires_at=now + ttl,
            last_activity_at=now + ttl,
        )
        if not await self.m.store.transition(paused, ("pausing",)):
            # Deleted meanwhile: its deletion may have looked for the workspace too early.
            await self.m.backend.discard_workspace(record.workspace)
            raise ServiceError(ErrorCode.SANDBOX_NOT_FOUND, f"sandbox {record.id} not found")
        return paused

    async def resume(self, sandbox_id: str) -> SandboxRecord:
        """A new cell on the kept workspace, with a new session key; the same id, env and
        metadata. Waits for a pause or resume under way (by any replica) to end first."""
        with recorded(self.m.audit, "sandbox.resume", sandbox_id):
            return await self._resume(sandbox_id)

    async def _resume(self, sandbox_id: str) -> SandboxRecord:
        while True:
            record = await self.settled(sandbox_id)
            if record.state == "running":
                return record
            if record.state != "paused":
                raise _conflict(record)
            resuming = dataclasses.replace(record, state="resuming")
            if await self.m.store.transition(resuming, ("paused",)):
                return await self._start(resuming)

    async def _start(self, record: SandboxRecord) -> SandboxRecord:
        template = self.m.template(record.template)
        policy = parse_policy(record.network) if record.network else template.egress_policy()
        env = {**proxy_env(policy), **record.env}
        try:
            if record.secrets:  # a new cell, a new CA (the last one went with its cell)
                env = {**env, **await self.m.backend.cell_trust(record.id)}
            warm = await self.m.prepare(
                template,
                env,
                sandbox_id=record.id,
                workspace=record.workspace,
                resources=record.resources,
            )
            await self.m.store.put_session_key(record.id, tokens.private_pem(warm.session_key))
        except BaseException:
            # The failed cell gave the workspace back: paused again, as it was.
            paused = dataclasses.replace(record, state="paused")
            await self.m.store.transition(paused, ("resuming",))
            raise
        now = time.time()
        running = dataclasses.replace(
            record,
            state="running",
            endpoint=warm.handle.endpoint,
            cell=warm.handle.cell,
            paused_at=0.0,
            last_activity_at=now,
            expires_at=now + (record.lifetime_s or template.max_lifetime_s),
        )
        if not await self.m.store.transition(running, ("resuming",)):
            await self.m.backend.destroy(warm.handle.cell)
            await self.m.backend.discard_workspace(record.workspace)
            raise ServiceError(ErrorCode.SANDBOX_NOT_FOUND, f"sandbox {record.id} not found")
        return running

    async def settle(self, record: SandboxRecord) -> SandboxRecord:
        """After a restart, a pause or resume that a crash cut short ends `paused` (a
        resume's new cell was an orphan, already destroyed, which sent the workspace home);
        a snapshot cut short goes back to what it was, its cell thawed."""
        if record.state == "snapshotting":
            if not record.paused_at:
                await self.m.backend.thaw(record.cell)
            await self.release(record)
            return dataclasses.replace(record, state="paused" if record.paused_at else "running")
        if record.state == "pausing":
            return await self.settle_pause(record)
        if record.state == "resuming":
            paused = dataclasses.replace(record, state="paused")
            await self.m.store.transition(paused, ("resuming",))
        return record


def paused_limit(record: SandboxRecord, limit: int) -> ServiceError:
    """The 409 of a pause past the key's bound: the sandbox goes on running, untouched."""
    return ServiceError(
        ErrorCode.CONFLICT,
        f"this key already keeps {limit} paused sandboxes (the server's max_paused_per_key):"
        " resume or delete one of them first",
        {"sandbox_id": record.id, "state": record.state, "max_paused_per_key": limit},
    )


def _conflict(record: SandboxRecord) -> ServiceError:
    return ServiceError(
        ErrorCode.CONFLICT,
        f"sandbox {record.id} is {record.state}",
        {"sandbox_id": record.id, "state": record.state},
    )
