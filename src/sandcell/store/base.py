"""The one store interface that the router and the manager program against."""

from __future__ import annotations

import json
import secrets
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, Self

from sandcell.audit.records import AuditHead, AuditPage, AuditQuery, AuditRecord

from .crypto import Sealer
from .nodes import check_node
from .records import (
    NODE_STATES,
    STATES,
    ApiKeyRecord,
    NodeRecord,
    NodeState,
    SandboxRecord,
    SnapshotRecord,
    State,
    UserSecretRecord,
)

FieldValue = str | int | float | bytes
SESSION_KEY_FIELD = "session_key"  # column / hash field holding the sealed session private key
# How long a slot held for a create in flight counts without its sandbox: far longer than any
# create takes, and the bound on what a process that died mid-create keeps from its owner.
RESERVATION_LEASE_S = 600.0
# The same for snapshot bytes held by a copy in flight: a copy of a large workspace on a slow
# disk may take many minutes, and a lease that ran out mid-copy would stop counting the bytes.
SNAPSHOT_LEASE_S = 3600.0
# What `start_pause` did: moved the sandbox to "pausing"; lost it to another caller (it is no
# longer "running"); or refused, the owner keeping its limit of paused workspaces already.
PauseStart = Literal["moved", "lost", "full"]
# What `put_user_secret` did: stored it; found the name taken; or refused, the owner keeping
# its limit of secrets already.
SecretPut = Literal["created", "exists", "full"]
USER_SECRET_VALUE_FIELD = "value"  # noqa: S105 - the column holding a sealed user secret


@dataclass(frozen=True)
class Reservation:
    """One of an owner's sandbox slots, held by a create in flight (see `reserve_sandbox`)."""

    owner: str
    token: str
    until: float

    @classmethod
    def new(cls, owner: str, now: float | None = None) -> Reservation:
        start = time.time() if now is None else now
        return cls(owner, f"reserved-{secrets.token_hex(8)}", start + RESERVATION_LEASE_S)


@dataclass(frozen=True)
class ByteReservation:
    """Snapshot bytes of an owner's quota, held by a copy in flight (`reserve_snapshot_bytes`)."""

    owner: str
    token: str
    size: int
    until: float

    @classmethod
    def new(cls, owner: str, size: int, now: float | None = None) -> ByteReservation:
        start = time.time() if now is None else now
        return cls(owner, f"reserved-{secrets.token_hex(8)}", size, start + SNAPSHOT_LEASE_S)

    def resized(self, size: int, now: float | None = None) -> ByteReservation:
        start = time.time() if now is None else now
        return ByteReservation(self.owner, self.token, size, start + SNAPSHOT_LEASE_S)


class ApiKeyExistsError(Exception):
    """An API key with this name already exists (revoked ones included: names are not reused)."""


def _session_aad(sandbox_id: str) -> bytes:
    return b"sandcell/session-key/" + sandbox_id.encode()


def _secret_aad(name: str) -> bytes:
    return b"sandcell/secret/" + name.encode()


def _user_secret_aad(owner: str, name: str) -> bytes:
    # JSON keeps the two parts apart whatever they hold: ("a/b", "c") is not ("a", "b/c").
    return b"sandcell/user-secret/" + json.dumps([owner, name]).encode()


class Store(ABC):
    """Async persistence for sandboxes, their session keys, API keys and manager secrets.

    `update_state`, `touch` and `put_session_key` only change a sandbox that exists: they return
    whether it did and never recreate one deleted meanwhile (say, by the reaper), so a late write
    cannot resurrect half a sandbox. Secrets are sealed and opened here, so backends only ever
    handle ciphertext and the AAD (naming the record a blob belongs to) is built in one place.
    """

    def __init__(self, sealer: Sealer) -> None:
        self._sealer = sealer

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # -- sandboxes ---------------------------------------------------------------------------

    @abstractmethod
    async def put_sandbox(self, rec: SandboxRecord, reservation: Reservation | None = None) -> None:
        """Create or replace a sandbox record; a session key already stored for it is kept.

        With a `reservation` (of the record's owner), the record takes the reserved slot's place
        in the same step, so the sandbox is never counted twice nor zero times.
        """

    @abstractmethod
    async def reserve_sandbox(self, owner: str, limit: int) -> Reservation | None:
        """Hold one of `owner`'s `limit` sandbox slots for a create in flight, or None if they
        are all taken (by sandboxes or by other reservations).

        Counting and holding are one atomic step, so concurrent creates cannot all pass the
        check before any of them is counted. A reservation ends when `put_sandbox` consumes it,
        when `release_reservation` drops it, or at its lease's end (a process died mid-create).
        """

    @abstractmethod
    async def release_reservation(self, reservation: Reservation) -> None:
        """Give the slot back (a create failed); a no-op once consumed or expired."""

    @abstractmethod
    async def get_sandbox(self, sandbox_id: str) -> SandboxRecord | None: ...

    async def update_state(self, sandbox_id: str, state: State) -> bool:
        if state not in STATES:
            raise ValueError(f"invalid sandbox state {state!r}; expected one of {STATES}")
        return await self._update_if_exists(sandbox_id, {"state": state})

    async def set_network(self, sandbox_id: str, policy: Mapping[str, Any]) -> bool:
        """Replace a sandbox's egress policy; the proxies read it on every new connection."""
        text = json.dumps(dict(policy), separators=(",", ":"), sort_keys=True)
        return await self._update_if_exists(sandbox_id, {"network": text})

    @abstractmethod
    async def touch(self, sandbox_id: str, now: float, idle_timeout_s: int | None = None) -> bool:
        """Record activity at `now` (and optionally a new idle timeout), in one round trip.

        Called on every proxied request, so it never reads the record first.
        """

    @abstractmethod
    async def list_sandboxes(self, owner: str | None = None) -> list[SandboxRecord]:
        """All sandboxes, or one owner's, oldest first."""

    @abstractmethod
    async def count_sandboxes(self, owner: str | None = None) -> int: ...

    @abstractmethod
    async def due_for_reaping(self, now: float, limit: int) -> list[str]:
        """Up to `limit` ids whose deadline (`SandboxRecord.deadline`) is at or before `now`."""

    @abstractmethod
    async def delete_sandbox(self, sandbox_id: str) -> bool:
        """Delete the record and its session key in one atomic step; False if already gone."""

    @abstractmethod
    async def transition(self, rec: SandboxRecord, expected: Sequence[str]) -> bool:
        """Replace the record's fields (its session key is kept) only if its stored state is
        one of `expected`, in one atomic step: of several callers (replicas) moving a sandbox
        out of the same state, exactly one wins (SPEC §13 pause, resume)."""

    @abstractmethod
    async def start_pause(self, rec: SandboxRecord, limit: int) -> PauseStart:
        """`transition(rec, ("running",))` for a pause (`rec.state` is "pausing"), only while
        its owner keeps fewer than `limit` workspaces of paused sandboxes (`keeps_workspace`).

        Counting and moving are one atomic step, so concurrent pauses of one owner's sandboxes
        cannot all pass the check before any of them is counted (the paused bound, SPEC §13).
        """

    @abstractmethod
    async def _update_if_exists(self, sandbox_id: str, fields: Mapping[str, FieldValue]) -> bool:
        """Overwrite some stored fields of an existing sandbox; never create one."""

    # -- snapshots ---------------------------------------------------------------------------

    @abstractmethod
    async def reserve_snapshot_bytes(
        self, owner: str, size: int, quota: int
    ) -> ByteReservation | None:
        """Hold `size` bytes of `owner`'s snapshot `quota` for a copy in flight, or None if
        its snapshots and the other copies in flight leave no room for them.

        Counting and holding are one atomic step, so concurrent snapshots cannot all pass the
        check before any of them is counted. A reservation ends when `put_snapshot` consumes
        it, when `release_snapshot_bytes` drops it, or at its lease's end (a process died).
        """

    @abstractmethod
    async def resize_snapshot_reservation(
        self, reservation: ByteReservation, size: int, quota: int
    ) -> ByteReservation | None:
        """The reservation held for `size` bytes instead (the copy's real size, known once it
        is made), its lease renewed; None, the old one kept, if a larger size does not fit."""

    @abstractmethod
    async def release_snapshot_bytes(self, reservation: ByteReservation) -> None:
        """Give the bytes back (a copy failed); a no-op once consumed or expired."""

    @abstractmethod
    async def snapshot_bytes_held(self, owner: str) -> int:
        """Bytes of `owner`'s snapshots and of its copies in flight (what the quota counts)."""

    @abstractmethod
    async def put_snapshot(
        self, rec: SnapshotRecord, reservation: ByteReservation | None = None
    ) -> None:
        """Add a snapshot; with a `reservation` (of the owner, settled to `rec.size_bytes`),
        the record takes the reserved bytes' place, so they are never counted zero times."""

    async def repair_snapshot_quota(self) -> None:  # noqa: B027 (optional: a default no-op)
        """After a restart: what the quota counts agrees again with the snapshots listed (a
        backend that counts apart from the records may have lost a step to a crash). A
        no-op where the records are what is counted."""

    @abstractmethod
    async def get_snapshot(self, snapshot_id: str) -> SnapshotRecord | None: ...

    @abstractmethod
    async def list_snapshots(self, owner: str | None = None) -> list[SnapshotRecord]:
        """All snapshots, or one owner's, oldest first."""

    @abstractmethod
    async def delete_snapshot(self, snapshot_id: str) -> bool: ...

    # -- session keys (sealed, bound to the sandbox id) ---------------------------------------

    async def put_session_key(self, sandbox_id: str, pem: bytes) -> bool:
        blob = self._sealer.seal(pem, _session_aad(sandbox_id))
        return await self._update_if_exists(sandbox_id, {SESSION_KEY_FIELD: blob})

    async def get_session_key(self, sandbox_id: str) -> bytes | None:
        blob = await self._get_session_blob(sandbox_id)
        return None if blob is None else self._sealer.open(blob, _session_aad(sandbox_id))

    @abstractmethod
    async def _get_session_blob(self, sandbox_id: str) -> bytes | None: ...

    # -- API keys -----------------------------------------------------------------------------

    @abstractmethod
    async def put_api_key(self, rec: ApiKeyRecord) -> None:
        """Add a key; raises ApiKeyExistsError if the name is taken."""

    @abstractmethod
    async def get_api_key_by_hash(self, key_hash: str) -> ApiKeyRecord | None:
        """The key's record, revoked or not: callers must check `revoked`."""

    @abstractmethod
    async def list_api_keys(self) -> list[ApiKeyRecord]:
        """All keys, revoked included, sorted by name."""

    @abstractmethod
    async def revoke_api_key(self, name: str) -> bool: ...

    # -- manager secrets (sealed, bound to their name) ----------------------------------------

    async def get_secret(self, name: str) -> bytes | None:
        blob = await self._get_secret_blob(name)
        return None if blob is None else self._sealer.open(blob, _secret_aad(name))

    async def put_secret_if_absent(self, name: str, value: bytes) -> bytes:
        """Store `value` unless `name` already has one; return the value that won.

        Lets replicas starting together each generate a candidate and all adopt the same one.
        """
        blob = await self._put_secret_blob_if_absent(
            name, self._sealer.seal(value, _secret_aad(name))
        )
        return self._sealer.open(blob, _secret_aad(name))

    @abstractmethod
    async def _get_secret_blob(self, name: str) -> bytes | None: ...

    @abstractmethod
    async def _put_secret_blob_if_absent(self, name: str, blob: bytes) -> bytes:
        """Store `blob` unless one exists; return the stored blob (ours or the earlier one)."""

    # -- principals' secrets (SPEC §17: sealed, bound to owner and name) ----------------------

    async def put_user_secret(self, rec: UserSecretRecord, value: bytes, limit: int) -> SecretPut:
        """Add a secret unless its owner has one by that name or `limit` of them already;
        counting and adding are one atomic step."""
        blob = self._sealer.seal(value, _user_secret_aad(rec.owner, rec.name))
        return await self._put_user_secret_blob(rec, blob, limit)

    async def update_user_secret(self, rec: UserSecretRecord, value: bytes | None) -> bool:
        """Replace an existing secret's fields, and its value when given (a rotation); never
        creates one. False if it is gone."""
        blob = None
        if value is not None:
            blob = self._sealer.seal(value, _user_secret_aad(rec.owner, rec.name))
        return await self._update_user_secret(rec, blob)

    async def user_secret_value(self, owner: str, name: str) -> bytes | None:
        """The current value, opened here only: a blob moved to another owner or name fails."""
        blob = await self._get_user_secret_blob(owner, name)
        return None if blob is None else self._sealer.open(blob, _user_secret_aad(owner, name))

    @abstractmethod
    async def _put_user_secret_blob(
        self, rec: UserSecretRecord, blob: bytes, limit: int
    ) -> SecretPut: ...

    @abstractmethod
    async def _update_user_secret(self, rec: UserSecretRecord, blob: bytes | None) -> bool: ...

    @abstractmethod
    async def _get_user_secret_blob(self, owner: str, name: str) -> bytes | None: ...

    @abstractmethod
    async def get_user_secret(self, owner: str, name: str) -> UserSecretRecord | None: ...

    @abstractmethod
    async def list_user_secrets(self, owner: str) -> list[UserSecretRecord]:
        """One owner's secrets, sorted by name."""

    @abstractmethod
    async def delete_user_secret(self, owner: str, name: str) -> bool: ...

    # -- the node roster (SPEC §18) -----------------------------------------------------------

    async def register_node(self, rec: NodeRecord) -> NodeRecord:
        """A node's registration and each of its heartbeats: the record's figures and
        `heartbeat_at` replace the stored ones in one step, but a known node keeps its stored
        `state` and `registered_at` (a heartbeat never undoes a drain). Returns what is stored.
        Raises a 400 ServiceError naming a field the node may not report."""
        check_node(rec)
        return await self._put_node(rec)

    async def set_node_state(self, name: str, state: NodeState) -> bool:
        """Drain a node (`draining`: no more placements) or put it back (`active`); False if
        no such node."""
        if state not in NODE_STATES:
            raise ValueError(f"invalid node state {state!r}; expected one of {NODE_STATES}")
        return await self._set_node_state(name, state)

    @abstractmethod
    async def _put_node(self, rec: NodeRecord) -> NodeRecord: ...

    @abstractmethod
    async def _set_node_state(self, name: str, state: NodeState) -> bool: ...

    @abstractmethod
    async def get_node(self, name: str) -> NodeRecord | None: ...

    @abstractmethod
    async def list_nodes(self) -> list[NodeRecord]:
        """The whole roster, sorted by name."""

    @abstractmethod
    async def remove_node(self, name: str) -> bool:
        """Forget a node (a node still running registers again at its next heartbeat)."""

    # -- the audit trail (SPEC §20): one append-only hash chain per writer ----------------------

    @abstractmethod
    async def append_audits(self, records: Sequence[AuditRecord]) -> None:
        """Append a run of one writer's sealed records to its chain only if each follows the
        one before and the first the stored head (`seq` one more, `prev` its hash), in one
        atomic step; else raise AuditConflictError and write nothing (two processes under
        one writer id cannot fork a chain)."""

    @abstractmethod
    async def audit_head(self, writer: str) -> AuditHead | None:
        """Where the writer's chain stands, or None if it never wrote."""

    @abstractmethod
    async def audit_writers(self) -> list[str]:
        """Every writer that has a chain, sorted."""

    @abstractmethod
    async def audit_chain(
        self, writer: str, after: int = 0, limit: int = 1000
    ) -> list[tuple[int, AuditRecord | None]]:
        """Up to `limit` of the writer's records stored at positions (seqs) above `after`, in
        position order, as stored: None for one that no longer reads as a record."""

    @abstractmethod
    async def list_audit(self, query: AuditQuery) -> AuditPage:
        """A page of records of every writer matching `query`, oldest first."""

    @abstractmethod
    async def prune_audit(self, writer: str, keep_from: int) -> int:
        """Drop the writer's records before seq `keep_from` and move its anchor there (the
        anchor's `prev` is the hash of the last record dropped), so the rest still verifies.
        Returns how many were dropped."""

    # -- lifecycle ----------------------------------------------------------------------------

    @abstractmethod
    async def ping(self) -> None:
        """Raise if the backend is unreachable (used by readiness checks)."""

    @abstractmethod
    async def close(self) -> None: ...
