"""`AuditTrail`: the audit writer of one serving process (SPEC §20).

An action notes its record (`note`) without waiting for the store: the request path pays for
a small object and a deque append. A task of the trail's own takes what has queued, seals it
into the writer's chain (`AuditLog`) and appends it to the store in one step per batch, then
writes the same records to the JSON-lines sink when one is set. A read of the trail
(`GET /v1/audit`) flushes first, so a caller always sees its own actions.

Failing closed: when the store cannot take the records (an outage longer than the backlog
holds, or a second process writing under this writer id), `admit` refuses new calls with 503
rather than letting actions go unrecorded; the records already noted wait in the backlog and
go in once the store takes them again.

Who acted comes from `CALLER`, a context variable the router sets when it authenticates a
request (each request runs in a task of its own, so it never leaks into another); actions with
no caller (the reaper's timeouts, a sandbox's own egress) are the system's or the sandbox
owner's.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import time
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING

from sandcell.audit.chain import AuditLog
from sandcell.audit.records import (
    Action,
    AuditRecord,
    CommandMode,
    Outcome,
    Touched,
    egress_detail,
)
from sandcell.errors import ErrorCode, ServiceError

if TYPE_CHECKING:
    from sandcell.store import Store

log = logging.getLogger("sandcell.audit")

LINGER_S = 0.02  # how long the first record of a batch waits for others (one commit for all)
MAX_BATCH = 512
MAX_BACKLOG = 20_000  # records noted and not yet stored; beyond it calls are refused
RETRY_S = 1.0  # after a store failure
CLOSE_WAIT_S = 10.0  # for the tasks' last store calls at shutdown
OWNER_CACHE = 4096


@dataclass(frozen=True, slots=True)
class Caller:
    """Who a record names: the principal and the name of the key it called with."""

    principal: str
    key_name: str = ""


CALLER: ContextVar[Caller | None] = ContextVar("sandcell_audit_caller", default=None)
SYSTEM = Caller("system", "")  # the manager's own actions: timeouts, the reaper


@dataclass(frozen=True, slots=True)
class Retention:
    max_age_s: float | None = None
    max_records: int | None = None
    every_s: float = 3600.0


@dataclass(frozen=True, slots=True)
class Noted:
    """A record before its place in the chain. `principal` None: the sandbox's owner,
    looked up when the batch is written (egress decisions know only the sandbox)."""

    at: float
    action: Action
    principal: str | None
    key_name: str
    sandbox_id: str
    outcome: Outcome
    status: int
    touched: Touched


def outcome_of(status: int) -> Outcome:
    return "ok" if status < 400 else "refused" if status < 500 else "error"


def status_of(exc: BaseException) -> int:
    return exc.status if isinstance(exc, ServiceError) else 500


class AuditTrail:
    """One writer's trail: `note` from anywhere in the process, `start`/`close` around
    serving."""

    def __init__(
        self,
        store: Store,
        writer: str,
        *,
        commands: CommandMode = "digest",
        sink: Path | None = None,
        retention: Retention | None = None,
        linger_s: float = LINGER_S,
        max_backlog: int = MAX_BACKLOG,
    ) -> None:
        self.store = store
        self.writer = writer
        self.commands: CommandMode = commands
        self.sink_path = sink
        self.retention = retention
        self.linger_s = linger_s
        self.max_backlog = max_backlog
        self._log = AuditLog(store, writer)
        self._backlog: collections.deque[Noted] = collections.deque()
        self._wake = asyncio.Event()
        self._flushing = asyncio.Lock()
        self._owners: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._sink: IO[str] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._closing = asyncio.Event()
        self.failing: str | None = None  # why the last write failed, until one succeeds

    # -- noting ----------------------------------------------------------------------------

    def note(
        self,
        action: Action,
        *,
        sandbox_id: str = "",
        status: int = 200,
        touched: Touched | None = None,
        caller: Caller | None = None,
        owner: bool = False,
    ) -> None:
        """Queue a record of `action` by `caller` (else the request's, else the system); with
        `owner` the sandbox's owner acted (its own code, e.g. an egress connection)."""
        who = None if owner else (caller or CALLER.get() or SYSTEM)
        self._backlog.append(
            Noted(
                time.time(),
                action,
                who.principal if who else None,
                who.key_name if who else "",
                sandbox_id,
                outcome_of(status),
                status,
                touched or {},
            )
        )
        if len(self._backlog) == 1:
            self._wake.set()

    @contextlib.contextmanager
    def action(
        self, action: Action, sandbox_id: str = "", touched: Mapping[str, str | int] | None = None
    ) -> Iterator[Touched]:
        """Records `action` once the block ends, with its outcome (a ServiceError's status,
        500 for anything else). The block may add to the yielded `touched`, or name the
        sandbox it made under the key "sandbox_id" (taken out of `touched`)."""
        detail: Touched = dict(touched or {})
        try:
            yield detail
        except BaseException as exc:
            if not isinstance(exc, asyncio.CancelledError | GeneratorExit):
                made = str(detail.pop("sandbox_id", sandbox_id))
                self.note(action, sandbox_id=made, status=status_of(exc), touched=detail)
            raise
        made = str(detail.pop("sandbox_id", sandbox_id))
        self.note(action, sandbox_id=made, touched=detail)

    def egress(self, sandbox_id: str, host: str, port: int, allowed: bool) -> None:
        """An egress proxy's decision on a connection of the sandbox's own code."""
        decision = "allowed" if allowed else "refused"
        detail = egress_detail(host=host, port=port, decision=decision)
        status = 200 if allowed else 403
        self.note(
            "egress.decision", sandbox_id=sandbox_id, status=status, touched=detail, owner=True
        )

    def remember_owner(self, sandbox_id: str, owner: str) -> None:
        self._owners[sandbox_id] = owner
        while len(self._owners) > OWNER_CACHE:
            self._owners.popitem(last=False)

    def admit(self) -> None:
        """Raise 503 when records cannot be kept (the store refuses them and the backlog is
        full): no action runs unrecorded."""
        if len(self._backlog) >= self.max_backlog:
            raise ServiceError(
                ErrorCode.OVERLOADED,
                "the audit trail cannot be written; retry shortly",
                {"reason": self.failing or "backlog full"},
                headers={"Retry-After": "1"},
            )

    # -- writing ---------------------------------------------------------------------------

    async def start(self) -> None:
        await self._log.load()
        if self.sink_path is not None:
            self._sink = _open_sink(self.sink_path)
        self._tasks.append(asyncio.create_task(self._write_loop(), name="audit-writer"))
        if self.retention is not None:
            self._tasks.append(asyncio.create_task(self._retain_loop(), name="audit-retention"))

    async def close(self) -> None:
        """Stores what is queued and stops. The tasks are asked to end, not cancelled: a store
        call cut in the middle can leave its connection unusable for the last flush."""
        self._closing.set()
        self._wake.set()
        if self._tasks:
            _, late = await asyncio.wait(self._tasks, timeout=CLOSE_WAIT_S)
            for task in late:
                task.cancel()
            for task in late:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._tasks.clear()
        try:
            await self.flush()
        except Exception as exc:  # told, not raised, at shutdown
            log.warning("audit: %d records could not be stored at shutdown: %s", len(self), exc)
        if self._sink is not None:
            self._sink.close()
            self._sink = None

    def __len__(self) -> int:
        return len(self._backlog)

    async def flush(self) -> list[AuditRecord]:
        """Store everything noted so far (raises what the store raised; the records stay
        queued)."""
        written: list[AuditRecord] = []
        async with self._flushing:
            while self._backlog:
                batch = [self._backlog[i] for i in range(min(MAX_BATCH, len(self._backlog)))]
                drafts = [await self._drafted(n) for n in batch]
                try:
                    records = await self._log.append_many(drafts)
                except (ValueError, TypeError) as exc:  # a record that cannot be one
                    records = await self._append_the_valid(drafts, exc)
                for _ in batch:
                    self._backlog.popleft()
                self._to_sink(records)
                written.extend(records)
            self.failing = None
        return written

    async def _append_the_valid(self, drafts: list[dict], why: Exception) -> list[AuditRecord]:
        """A batch refused for what a record holds (a bug, never the caller's input: texts
        are made valid first) would block every record after it: its valid records go in,
        and each invalid one is told, loudly, and dropped."""
        records: list[AuditRecord] = []
        for draft in drafts:
            try:
                records += await self._log.append_many([draft])
            except (ValueError, TypeError):
                log.exception("audit: a %s record could not be made, dropped", draft["action"])
        if not records:
            log.error("audit: a batch could not be stored: %s", why)
        return records

    async def _drafted(self, noted: Noted) -> dict:
        principal = noted.principal
        if principal is None:
            principal = self._owners.get(noted.sandbox_id)
            if principal is None:
                record = await self.store.get_sandbox(noted.sandbox_id)
                principal = record.owner if record is not None else "unknown"
                self.remember_owner(noted.sandbox_id, principal)
        return {
            "at": noted.at,
            "principal": principal,
            "key_name": noted.key_name,
            "action": noted.action,
            "sandbox_id": noted.sandbox_id,
            "outcome": noted.outcome,
            "status": noted.status,
            "touched": noted.touched,
        }

    async def _write_loop(self) -> None:
        while not self._closing.is_set():
            await self._wake.wait()
            self._wake.clear()
            if self.linger_s and len(self._backlog) < MAX_BATCH:
                await self._pause(self.linger_s)  # gather a batch: one commit for many
            try:
                await self.flush()
            except Exception as exc:  # kept queued, retried, told
                if self.failing is None:
                    log.warning("audit: records not stored, kept and retried: %s", exc)
                self.failing = str(exc) or type(exc).__name__
                await self._pause(RETRY_S)
            if self._backlog:
                self._wake.set()

    async def _pause(self, seconds: float) -> None:
        """Waits `seconds`, or less when the trail is closing."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._closing.wait(), seconds)

    async def _retain_loop(self) -> None:
        from sandcell.audit.retention import prune

        assert self.retention is not None
        while not self._closing.is_set():
            try:
                dropped = await prune(
                    self.store,
                    max_age_s=self.retention.max_age_s,
                    max_records=self.retention.max_records,
                )
                if any(dropped.values()):
                    log.info("audit retention dropped %s", dropped)
            except Exception as exc:  # the next round tries again
                log.warning("audit retention failed: %s", exc)
            if self._closing.is_set():
                return
            await self._pause(self.retention.every_s)

    def _to_sink(self, records: list[AuditRecord]) -> None:
        if self._sink is None or not records:
            return
        try:
            self._sink.write("".join(rec.to_json() + "\n" for rec in records))
            self._sink.flush()
        except OSError as exc:  # the store has them: the sink is a copy for shippers
            log.warning("audit sink %s: %s", self.sink_path, exc)


@contextlib.contextmanager
def recorded(
    trail: AuditTrail | None,
    action: Action,
    sandbox_id: str = "",
    touched: Mapping[str, str | int] | None = None,
) -> Iterator[Touched]:
    """`AuditTrail.action` where a trail may not be configured (then nothing is recorded)."""
    if trail is None:
        yield {}
        return
    with trail.action(action, sandbox_id, touched) as detail:
        yield detail


def _open_sink(path: Path) -> IO[str]:
    """Appended to, never truncated; 0600 when made (records name principals and hosts)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    return os.fdopen(fd, "a", encoding="utf-8")
