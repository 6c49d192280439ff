"""`AuditLog`: one writer's end of its chain. It takes each record's `seq` and `prev` from the
record before, seals it, and appends it through the store, which refuses an append that does
not follow the stored head: a second process under the same writer id fails clearly instead
of forking the chain."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sandcell.audit.records import GENESIS, Action, AuditRecord, Outcome, Touched

if TYPE_CHECKING:
    from sandcell.store import Store


class AuditLog:
    """Appends one writer's records (a router's or node's name), in order: one per writer id
    and process. After a refused append it stays where it was, so every later append is
    refused too, until the process is restarted under a writer id of its own."""

    def __init__(self, store: Store, writer: str, clock: Callable[[], float] = time.time) -> None:
        if not writer:
            raise ValueError("an audit writer needs a name")
        self._store, self.writer, self._clock = store, writer, clock
        self._lock = asyncio.Lock()
        self._head: tuple[int, str] | None = None  # (seq, hash) of this writer's last record

    async def load(self) -> None:
        """Take up the chain where the store has it (the first append does this otherwise)."""
        async with self._lock:
            await self._load()

    async def _load(self) -> None:
        head = await self._store.audit_head(self.writer)
        self._head = (head.seq, head.hash) if head is not None else (0, GENESIS)

    async def append(
        self,
        action: Action,
        *,
        principal: str,
        key_name: str,
        sandbox_id: str = "",
        outcome: Outcome = "ok",
        status: int = 200,
        touched: Touched | None = None,
    ) -> AuditRecord:
        draft = {
            "at": self._clock(),
            "principal": principal,
            "key_name": key_name,
            "action": action,
            "sandbox_id": sandbox_id,
            "outcome": outcome,
            "status": status,
            "touched": dict(touched or {}),
        }
        (rec,) = await self.append_many([draft])
        return rec

    async def append_many(self, drafts: list[dict[str, Any]]) -> list[AuditRecord]:
        """Several records in order, each chained to the one before, stored in one step
        (`Store.append_audits`): all of them or, on a refusal, none. A draft is the
        keyword arguments of `AuditRecord` without `writer`, `seq`, `prev` and `hash`."""
        async with self._lock:  # seq and prev are taken and advanced in one step
            if self._head is None:
                await self._load()
            assert self._head is not None
            seq, prev = self._head
            records = []
            for draft in drafts:
                seq += 1
                rec = AuditRecord(writer=self.writer, seq=seq, prev=prev, **draft).sealed()
                records.append(rec)
                prev = rec.hash
            if records:
                await self._store.append_audits(records)  # AuditConflictError: none stored
                self._head = (seq, prev)
            return records
