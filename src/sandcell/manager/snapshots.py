"""Snapshots (SPEC §13): consistent copies of a sandbox's workspace, owned by a principal.

A snapshot is taken while the sandbox is held (`Persistence.hold`: no pause, resume or other
snapshot meanwhile, on any replica), its live cell frozen for the copy. The copy is published
by a rename and its record written last, so a crash leaves at most an unlisted file, which the
next start removes; a listed snapshot is always whole.

The per-principal byte quota is held, not only checked, before copying: the workspace's size
is reserved in the store in one atomic step (`Store.reserve_snapshot_bytes`), so snapshots
taken at once (of one principal's sandboxes, on any replica) cannot all pass a check that
none of them is counted in yet. Once the copy is made its real size replaces the estimate
(the tenant may write while it is measured, and holes or shared blocks make copies smaller);
if it grew beyond what fits, the copy is dropped with the same 413. A failed copy gives the
bytes back, and a process that dies mid-copy holds them only until the reservation's lease
ends.
"""

from __future__ import annotations

import logging
import secrets
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandcell.audit.trail import recorded
from sandcell.errors import ErrorCode, ServiceError
from sandcell.isolation.disk import DiskError
from sandcell.store import ByteReservation, SnapshotRecord

if TYPE_CHECKING:
    from sandcell.manager.manager import Manager

DEFAULT_QUOTA_BYTES = 10 * 1024**3
log = logging.getLogger("sandcell.manager.snapshots")


def new_snapshot_id() -> str:
    return f"snap-{secrets.token_hex(8)}"


class Snapshots:
    def __init__(self, manager: Manager, quota_bytes: int = DEFAULT_QUOTA_BYTES) -> None:
        self.m = manager
        self.quota_bytes = quota_bytes

    async def take(self, owner: str, sandbox_id: str, name: str | None = None) -> SnapshotRecord:
        snapshot_id = new_snapshot_id()
        with recorded(self.m.audit, "sandbox.snapshot", sandbox_id, {"snapshot": snapshot_id}):
            return await self._take(owner, sandbox_id, snapshot_id, name)

    async def _take(
        self, owner: str, sandbox_id: str, snapshot_id: str, name: str | None
    ) -> SnapshotRecord:
        dest = self.m.backend.snapshot_path(snapshot_id)  # 501 where none can be taken
        held = await self.m.persistence.hold(sandbox_id)
        cell = None if held.paused_at else held.cell
        reservation: ByteReservation | None = None
        try:
            try:
                estimate = await self.m.backend.workspace_bytes(cell, held.workspace)
                reservation = await self._reserve(owner, estimate)
                size = await self._copy(sandbox_id, cell, held.workspace, dest)
            finally:
                await self.m.persistence.release(held)
            record = SnapshotRecord(
                snapshot_id, owner, sandbox_id, name or "", held.template, time.time(), size, dest
            )
            try:
                reservation = await self._settle(reservation, size)
                await self.m.store.put_snapshot(record, reservation)
            except BaseException:
                await self.m.backend.discard_workspace(dest)
                raise
        except BaseException:
            if reservation is not None:  # a no-op once put_snapshot consumed it
                await self.m.store.release_snapshot_bytes(reservation)
            raise
        return record

    async def _copy(
        self, sandbox_id: str, cell: dict[str, Any] | None, home: str, dest: str
    ) -> int:
        try:
            return await self.m.backend.copy_workspace(cell, home, dest)
        except DiskError as exc:
            log.warning("snapshot of %s failed: %s", sandbox_id, exc)
            raise ServiceError(
                ErrorCode.OVERLOADED,
                "the snapshot could not be written (the server's disk may be full)",
                {"sandbox_id": sandbox_id},
            ) from None

    async def _reserve(self, owner: str, size: int) -> ByteReservation:
        """`size` bytes of the owner's quota held for the copy, or the quota's 413."""
        reservation = await self.m.store.reserve_snapshot_bytes(owner, size, self.quota_bytes)
        if reservation is None:
            raise await self._over_quota(owner, size)
        return reservation

    async def _settle(self, reservation: ByteReservation, size: int) -> ByteReservation:
        """The reservation held for the copy's real `size`, or the quota's 413 if it grew
        past what fits (the tenant wrote while it was measured): the caller drops the copy."""
        if size == reservation.size:
            return reservation
        settled = await self.m.store.resize_snapshot_reservation(
            reservation, size, self.quota_bytes
        )
        if settled is None:
            raise await self._over_quota(reservation.owner, size, held_by_us=reservation.size)
        return settled

    async def _over_quota(self, owner: str, size: int, held_by_us: int = 0) -> ServiceError:
        used = await self.m.store.snapshot_bytes_held(owner) - held_by_us
        return ServiceError(
            ErrorCode.PAYLOAD_TOO_LARGE,
            f"this snapshot ({size} bytes) would exceed the snapshot quota "
            f"({used} of {self.quota_bytes} bytes used)",
            {"size_bytes": size, "used_bytes": used, "quota_bytes": self.quota_bytes},
        )

    async def owned(self, owner: str | None, snapshot_id: str) -> SnapshotRecord:
        """The snapshot if `owner` (None: an admin) has it; else 404, not revealing it."""
        record = await self.m.store.get_snapshot(snapshot_id)
        if record is None or owner not in (None, record.owner):
            raise ServiceError(
                ErrorCode.NOT_FOUND,
                f"snapshot {snapshot_id} not found",
                {"snapshot_id": snapshot_id},
            )
        return record

    async def delete(self, record: SnapshotRecord) -> None:
        with recorded(self.m.audit, "snapshot.delete", record.sandbox_id, {"snapshot": record.id}):
            # Record first: from then on nobody can start from it, and the file is an orphan.
            await self.m.store.delete_snapshot(record.id)
            await self.m.backend.discard_workspace(record.path)

    async def workspace_from(self, record: SnapshotRecord, sandbox_id: str) -> str:
        """A new sandbox's kept workspace, copied from the snapshot."""
        home = self.m.backend.workspace_home(sandbox_id)
        try:
            await self.m.backend.copy_workspace(None, record.path, home)
        except DiskError as exc:
            log.warning("copy of snapshot %s failed: %s", record.id, exc)
            raise ServiceError(
                ErrorCode.OVERLOADED, "no room for the sandbox's workspace on the server"
            ) from None
        return home

    async def remove_orphans(self) -> list[str]:
        """Snapshot files that no record names (a crash before the record was written)."""
        try:
            folder = Path(self.m.backend.snapshot_path("x")).parent
        except ServiceError:
            return []  # this backend keeps none
        await self.m.store.repair_snapshot_quota()
        if not folder.is_dir():
            return []
        known = {s.path for s in await self.m.store.list_snapshots()}
        orphans = [p for p in folder.iterdir() if str(p) not in known]
        for path in orphans:
            await self.m.backend.discard_workspace(str(path))
        return [p.name for p in orphans]
