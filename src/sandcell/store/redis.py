"""Redis / Valkey backend, shared by several router and manager replicas.

Key layout (the `{...}` part is the hash tag that picks the Redis Cluster slot):

    sandcell:sbx:{<id>}            hash    SandboxRecord.to_flat() + `session_key` (sealed)
    sandcell:{idx}:expiry          zset    id -> expires_at (exact)
    sandcell:{idx}:idle            zset    id -> last_activity_at + idle_timeout_s (lower bound)
    sandcell:{idx}:owner:<owner>   zset    id -> when the entry was written
    sandcell:quota:{<owner>}       zset    id -> expires_at; reservation token -> its lease's end
    sandcell:paused:{<owner>}      zset    id of a sandbox that keeps a workspace -> its end
    sandcell:snapquota:{<owner>}   hash    snapshot id -> bytes; reservation token -> bytes:end
    sandcell:snap:{<id>}           hash    SnapshotRecord.to_flat()
    sandcell:{idx}:snaps           zset    snapshot id -> created_at
    sandcell:apikey:{<key hash>}   hash    ApiKeyRecord.to_flat()
    sandcell:{apikeys}:names       hash    name -> key hash
    sandcell:secret:{<name>}       string  sealed value (the manager's own secrets)
    sandcell:usecret:{<owner>}:<name>  hash  UserSecretRecord.to_flat() + `value` (sealed)
    sandcell:usecrets:{<owner>}    set     the owner's secret names (same slot: one script)
    sandcell:node:{nodes}:<name>   hash    NodeRecord.to_flat() (the node roster, SPEC §18)
    sandcell:{nodes}:names         set     the roster's names (same slot: one script)
    sandcell:audit:{<writer>}:records  hash  seq -> the AuditRecord's canonical JSON (SPEC §20)
    sandcell:audit:{<writer>}:head     hash  AuditHead's fields (same slot: one script)
    sandcell:audit:{<writer>}:at       zset  seq by time: the writer's records in time order
    sandcell:audit:{<writer>}:p:<principal>  zset  the same for one principal's records
    sandcell:{audit}:writers       set     the writers that have a chain

Each sandbox is one hash in a slot of its own, holding its session key too, so one DEL removes
record and key together. The indexes live elsewhere and are updated by non-transactional
pipelines; nothing here runs MULTI/EXEC or a script over keys in different slots. The price is
that an index may list an id whose hash is gone (for a moment, or for good after a client died
mid-pipeline). Readers therefore check the hash and drop such ids, and prune them once their
score is more than STALE_GRACE_S in the past: a younger one may belong to a put_sandbox in
flight, which writes its index entries before its hash so that no sandbox is ever unindexed.

The idle index holds a lower bound of each idle deadline, so the hot path, touch, only rewrites
hash fields (activity only pushes the deadline later); it writes the index too only when a new
idle timeout could pull the deadline earlier. due_for_reaping checks every candidate against its
hash and moves those not yet due to their true idle deadline.

The quota set counts an owner's sandboxes and the creates in flight that hold a slot. It is one
key, so a script can count and reserve atomically (`reserve_sandbox`) and a record can take its
reservation's place in one step. Every entry carries its own end (a sandbox cannot outlive its
`expires_at`, a reservation its lease), and the reserve script drops ended ones first: an entry
that a crash left behind stops counting by itself.

The paused set does the same for the per-key bound on paused sandboxes (`start_pause`): a
paused sandbox's entry ends with its paused TTL, one pausing or resuming with a lease.

The snapshot quota hash counts an owner's snapshot bytes and the bytes held by copies in
flight, so one script can count and hold atomically (`reserve_snapshot_bytes`). A snapshot's
entry is written after its record and removed after it, so a crash between leaves the quota
counting what the records hold or less until the lease ends, or a little more (a deleted
snapshot's bytes): `repair_snapshot_quota`, run at start, sets both right.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar, cast

from redis.asyncio import Redis
from redis.typing import EncodableT, ZSetRangeResponse, ZSetScoredMembers

from sandcell.audit.records import (
    GENESIS,
    AuditConflictError,
    AuditHead,
    AuditPage,
    AuditQuery,
    AuditRecord,
    order_key,
    page_of,
    parse_cursor,
)

from .base import (
    RESERVATION_LEASE_S,
    SESSION_KEY_FIELD,
    USER_SECRET_VALUE_FIELD,
    ApiKeyExistsError,
    ByteReservation,
    FieldValue,
    PauseStart,
    Reservation,
    SecretPut,
    Store,
)
from .crypto import Sealer
from .records import (
    PARKED_STATES,
    ApiKeyRecord,
    Flat,
    NodeRecord,
    NodeState,
    SandboxRecord,
    SnapshotRecord,
    UserSecretRecord,
    deadline_of,
)

STALE_GRACE_S = 60.0

EXPIRY_INDEX = "sandcell:{idx}:expiry"
IDLE_INDEX = "sandcell:{idx}:idle"
API_KEY_NAMES = "sandcell:{apikeys}:names"
NODE_NAMES = "sandcell:{nodes}:names"
AUDIT_WRITERS = "sandcell:{audit}:writers"
AUDIT_SCAN = 500  # records read at a time from a writer's time index
SNAPSHOT_INDEX = "sandcell:{idx}:snaps"

_SBX_FIELDS = SandboxRecord.fields()
_KEY_FIELDS = ApiKeyRecord.fields()
_SNAP_FIELDS = SnapshotRecord.fields()
_USECRET_FIELDS = UserSecretRecord.fields()
_NODE_FIELDS = NodeRecord.fields()
_DEADLINE_FIELDS = ("expires_at", "last_activity_at", "idle_timeout_s")

# Every script touches a single key, so they are safe on a cluster.
_HSET_IF_EXISTS = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV))
return 1
"""
_RESCORE_IF_UNCHANGED = """
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score or tonumber(score) ~= tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
return 1
"""

# ARGV: the number n of expected states, those n states, then field/value pairs.
_HSET_IF_STATE = """
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return 0 end
local n = tonumber(ARGV[1])
for i = 2, n + 1 do
  if ARGV[i] == state then
    redis.call('HSET', KEYS[1], unpack(ARGV, n + 2))
    return 1
  end
end
return 0
"""

_RESERVE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[4])
return 1
"""
_TAKE_SLOT = """
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[2])
return 1
"""
# ARGV: now, limit, sandbox id, the entry's end. An id counted already stays as it is.
_PAUSE_SLOT = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if redis.call('ZSCORE', KEYS[1], ARGV[3]) then return 1 end
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[4], ARGV[3])
return 1
"""
# ARGV: now, size, quota, token, the lease's end. Ended reservations are dropped first; the
# token's own entry (a resize) is not counted against itself. Returns 1 if held, else 0.
_HOLD_BYTES = """
local now = tonumber(ARGV[1])
local held = 0
local entries = redis.call('HGETALL', KEYS[1])
for i = 1, #entries, 2 do
  local size, ends = string.match(entries[i + 1], '^(%d+):(.+)$')
  if ends and tonumber(ends) <= now then
    redis.call('HDEL', KEYS[1], entries[i])
  elseif entries[i] ~= ARGV[4] then
    held = held + tonumber(size or entries[i + 1])
  end
end
if held + tonumber(ARGV[2]) > tonumber(ARGV[3]) then return 0 end
redis.call('HSET', KEYS[1], ARGV[4], ARGV[2] .. ':' .. ARGV[5])
return 1
"""
_BYTES_HELD = """
local now = tonumber(ARGV[1])
local held = 0
local entries = redis.call('HGETALL', KEYS[1])
for i = 2, #entries, 2 do
  local size, ends = string.match(entries[i], '^(%d+):(.+)$')
  if not ends or tonumber(ends) > now then held = held + tonumber(size or entries[i]) end
end
return held
"""
# KEYS: the secret's hash, its owner's name set (one slot). ARGV: limit, name, field/value pairs.
_ADD_SEALED = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 'exists' end
if redis.call('SCARD', KEYS[2]) >= tonumber(ARGV[1]) then return 'full' end
redis.call('HSET', KEYS[1], unpack(ARGV, 3))
redis.call('SADD', KEYS[2], ARGV[2])
return 'created'
"""
_DROP_SEALED = """
redis.call('SREM', KEYS[2], ARGV[1])
return redis.call('DEL', KEYS[1])
"""
# KEYS: the node's hash, the roster's name set (one slot). ARGV: name, state, registered_at,
# then the other field/value pairs. A known node keeps its state and registered_at.
_PUT_NODE = """
redis.call('HSETNX', KEYS[1], 'state', ARGV[2])
redis.call('HSETNX', KEYS[1], 'registered_at', ARGV[3])
redis.call('HSET', KEYS[1], unpack(ARGV, 4))
redis.call('SADD', KEYS[2], ARGV[1])
return redis.call('HGETALL', KEYS[1])
"""
# KEYS: a writer's audit records, head and time index (one slot), then each record's principal
# index. ARGV: GENESIS, then per record its seq, prev, hash, JSON and time. Appends the run
# only if each record follows the one before, the first the head; returns -1 if it did, else
# the head's seq (nothing written).
_APPEND_AUDIT = """
local seq = tonumber(redis.call('HGET', KEYS[2], 'seq') or '0')
local head = redis.call('HGET', KEYS[2], 'hash') or ARGV[1]
local at, last = seq, head
for i = 2, #ARGV, 5 do
  if tonumber(ARGV[i]) ~= at + 1 or ARGV[i + 1] ~= last then return seq end
  at, last = at + 1, ARGV[i + 2]
end
local n = 0
for i = 2, #ARGV, 5 do
  n = n + 1
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 3])
  redis.call('ZADD', KEYS[3], ARGV[i + 4], ARGV[i])
  redis.call('ZADD', KEYS[3 + n], ARGV[i + 4], ARGV[i])
end
redis.call('HSET', KEYS[2], 'seq', at, 'hash', last)
redis.call('HSETNX', KEYS[2], 'anchor_seq', 1)
redis.call('HSETNX', KEYS[2], 'anchor_prev', ARGV[1])
return -1
"""
_TAKE_BYTES = """
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
return 1
"""


def _sandbox_key(sandbox_id: str) -> str:
    return f"sandcell:sbx:{{{sandbox_id}}}"


def _owner_index(owner: str) -> str:
    return f"sandcell:{{idx}}:owner:{owner}"


def _quota_key(owner: str) -> str:
    return f"sandcell:quota:{{{owner}}}"


def _paused_key(owner: str) -> str:
    return f"sandcell:paused:{{{owner}}}"


def _snapshot_quota_key(owner: str) -> str:
    return f"sandcell:snapquota:{{{owner}}}"


def _paused_entry_end(rec: SandboxRecord, now: float) -> float:
    """A paused sandbox's entry ends with its paused TTL (its `expires_at` then); one moving
    its workspace gets a lease, as its `expires_at` may be its old lifetime's, past already."""
    if rec.state == "paused":
        return rec.expires_at
    return max(rec.expires_at, now + RESERVATION_LEASE_S)


def _snapshot_key(snapshot_id: str) -> str:
    return f"sandcell:snap:{{{snapshot_id}}}"


def _api_key_key(key_hash: str) -> str:
    return f"sandcell:apikey:{{{key_hash}}}"


def _secret_key(name: str) -> str:
    return f"sandcell:secret:{{{name}}}"


def _user_secret_key(owner: str, name: str) -> str:
    return f"sandcell:usecret:{{{owner}}}:{name}"


def _user_secrets_key(owner: str) -> str:
    return f"sandcell:usecrets:{{{owner}}}"


def _node_key(name: str) -> str:
    return f"sandcell:node:{{nodes}}:{name}"


def _audit_keys(writer: str) -> tuple[str, str]:
    """A writer's records and head, in one slot."""
    return (f"sandcell:audit:{{{writer}}}:records", f"sandcell:audit:{{{writer}}}:head")


def _audit_index(writer: str, principal: str | None = None) -> str:
    """A writer's records in time order (seq by `at`), all or one principal's (same slot)."""
    base = f"sandcell:audit:{{{writer}}}"
    return f"{base}:at" if principal is None else f"{base}:p:{principal}"


def _audit_record(raw: bytes | str | None) -> AuditRecord | None:
    """A stored value as a record, or None if an edit left it no longer one."""
    try:
        return None if raw is None else AuditRecord.from_json(raw)
    except (ValueError, TypeError):
        return None


# The client is made without decode_responses (factory.py), so every reply is bytes; redis-py
# types replies `bytes | str`, not knowing which its client was made with.
def _text(reply: bytes | str) -> str:
    return reply.decode() if isinstance(reply, bytes) else reply


def _blob(reply: bytes | str | None) -> bytes | None:
    assert not isinstance(reply, str), "the client decodes no replies"
    return reply


def _members(entries: ZSetRangeResponse) -> list[str]:
    """A range's members (asked without scores)."""
    return [_text(member) for member in cast(list[bytes | str], entries)]


def _scored(entries: ZSetRangeResponse) -> list[tuple[str, float]]:
    """A range asked WITHSCORES: redis-py answers (member, score) pairs, scores as floats."""
    return [(_text(member), score) for member, score in cast(ZSetScoredMembers, entries)]


def _hash(flat: Flat) -> Mapping[EncodableT, EncodableT]:
    # HSET only reads the mapping; Mapping's key type is invariant, so a str-keyed one is not
    # taken for a mapping of redis-py's key union, which str is part of.
    return cast(Mapping[EncodableT, EncodableT], flat)


def _hset_if_exists(client: Any, key: str, fields: Mapping[str, FieldValue]) -> Any:
    """Queue (on a pipeline) or run (on a client) an HSET that never creates the hash."""
    return client.eval(_HSET_IF_EXISTS, 1, key, *itertools.chain.from_iterable(fields.items()))


class RedisStore(Store):
    def __init__(self, client: Redis, sealer: Sealer) -> None:
        super().__init__(sealer)
        self._r = client

    async def _hmget_many(self, keys: Sequence[str], fields: Sequence[str]) -> list[list[Any]]:
        async with self._r.pipeline(transaction=False) as p:
            for key in keys:
                p.hmget(key, fields)
            return await p.execute()

    async def _prune(self, ids: Sequence[str], *indexes: str) -> None:
        """Forget ids whose hash is gone, in the deadline indexes and any `indexes` given."""
        if ids:
            async with self._r.pipeline(transaction=False) as p:
                for index in (EXPIRY_INDEX, IDLE_INDEX, *indexes):
                    p.zrem(index, *ids)
                await p.execute()

    # -- sandboxes ---------------------------------------------------------------------------

    async def put_sandbox(self, rec: SandboxRecord, reservation: Reservation | None = None) -> None:
        token = reservation.token if reservation is not None else ""
        async with self._r.pipeline(transaction=False) as p:
            # Indexes first: a crash part-way leaves a stale index entry, never a lost sandbox.
            p.zadd(EXPIRY_INDEX, {rec.id: rec.expires_at})
            p.zadd(IDLE_INDEX, {rec.id: rec.last_activity_at + rec.idle_timeout_s})
            p.zadd(_owner_index(rec.owner), {rec.id: time.time()})
            p.eval(_TAKE_SLOT, 1, _quota_key(rec.owner), token, rec.id, rec.expires_at)
            p.hset(_sandbox_key(rec.id), mapping=_hash(rec.to_flat()))
            await p.execute()

    async def reserve_sandbox(self, owner: str, limit: int) -> Reservation | None:
        reservation = Reservation.new(owner)
        args = (time.time(), limit, reservation.until, reservation.token)
        held = await self._r.eval(_RESERVE, 1, _quota_key(owner), *args)
        return reservation if held else None

    async def release_reservation(self, reservation: Reservation) -> None:
        await self._r.zrem(_quota_key(reservation.owner), reservation.token)

    async def get_sandbox(self, sandbox_id: str) -> SandboxRecord | None:
        values = await self._r.hmget(_sandbox_key(sandbox_id), _SBX_FIELDS)
        return _from_hmget(SandboxRecord, values)

    async def touch(self, sandbox_id: str, now: float, idle_timeout_s: int | None = None) -> bool:
        if idle_timeout_s is None:  # the hot path: one script call, cheaper than a pipeline
            return await self._update_if_exists(sandbox_id, {"last_activity_at": now})
        fields = {"last_activity_at": now, "idle_timeout_s": idle_timeout_s}
        async with self._r.pipeline(transaction=False) as p:
            # A new timeout can pull the idle deadline earlier, so the index follows right away.
            p.zadd(IDLE_INDEX, {sandbox_id: now + idle_timeout_s}, xx=True)
            _hset_if_exists(p, _sandbox_key(sandbox_id), fields)
            return bool((await p.execute())[-1])

    async def list_sandboxes(self, owner: str | None = None) -> list[SandboxRecord]:
        index = EXPIRY_INDEX if owner is None else _owner_index(owner)
        entries = _scored(await self._r.zrange(index, 0, -1, withscores=True))
        ids = [member for member, _ in entries]
        rows = await self._hmget_many(list(map(_sandbox_key, ids)), _SBX_FIELDS)
        records = [_from_hmget(SandboxRecord, row) for row in rows]
        cutoff = time.time() - STALE_GRACE_S
        gone = zip(ids, entries, records, strict=True)
        stale = [i for i, (_, score), r in gone if r is None and score <= cutoff]
        await self._prune(stale, index, *([] if owner is None else [_quota_key(owner)]))
        live = [r for r in records if r is not None and owner in (None, r.owner)]
        return sorted(live, key=lambda r: (r.created_at, r.id))

    async def count_sandboxes(self, owner: str | None = None) -> int:
        # Index cardinality would count stale entries; the records are few and small.
        return len(await self.list_sandboxes(owner))

    async def due_for_reaping(self, now: float, limit: int) -> list[str]:
        due: dict[str, None] = {}  # an ordered set
        for index in (EXPIRY_INDEX, IDLE_INDEX):
            await self._sweep(index, now, limit, due)
        return list(due)

    async def _sweep(self, index: str, now: float, limit: int, due: dict[str, None]) -> None:
        """Add to `due` the ids of `index` scored <= now that really are due, up to `limit`.

        Entries that stay in range (due ones, and stale ones still in their grace period) are
        stepped over with `offset`; the rest leave the range (pruned, or rescored to a future
        deadline), so every pass makes progress.
        """
        offset = 0
        while len(due) < limit:
            want = limit - len(due)
            batch = _scored(
                await self._r.zrangebyscore(
                    index, "-inf", now, start=offset, num=want, withscores=True
                )
            )
            ids = [member for member, _ in batch]
            rows = await self._hmget_many(list(map(_sandbox_key, ids)), _DEADLINE_FIELDS)
            stale: list[str] = []
            rescore: list[tuple[str, float, float]] = []
            for sandbox_id, (_, score), (expires, last, idle) in zip(ids, batch, rows, strict=True):
                if expires is None:
                    if score <= now - STALE_GRACE_S:
                        stale.append(sandbox_id)
                        continue
                elif deadline_of(float(expires), float(last), int(idle)) <= now:
                    due[sandbox_id] = None
                elif index == IDLE_INDEX:
                    rescore.append((sandbox_id, score, float(last) + int(idle)))
                    continue
                offset += 1
            await self._prune(stale)
            if rescore:
                async with self._r.pipeline(transaction=False) as p:
                    for sandbox_id, old, new in rescore:
                        p.eval(_RESCORE_IF_UNCHANGED, 1, IDLE_INDEX, sandbox_id, old, new)
                    offset += (await p.execute()).count(0)  # moved meanwhile: step over it
            if len(batch) < want:
                return

    async def delete_sandbox(self, sandbox_id: str) -> bool:
        key = _sandbox_key(sandbox_id)
        async with self._r.pipeline(transaction=False) as p:
            # Hash first: a crash part-way leaves stale index entries, which readers tolerate.
            p.hget(key, "owner")
            p.delete(key)
            p.zrem(EXPIRY_INDEX, sandbox_id)
            p.zrem(IDLE_INDEX, sandbox_id)
            owner, deleted, *_ = await p.execute()
        if owner is not None:
            async with self._r.pipeline(transaction=False) as p:
                p.zrem(_owner_index(owner.decode()), sandbox_id)
                p.zrem(_quota_key(owner.decode()), sandbox_id)
                p.zrem(_paused_key(owner.decode()), sandbox_id)
                await p.execute()
        return deleted == 1

    async def transition(self, rec: SandboxRecord, expected: Sequence[str]) -> bool:
        pairs = itertools.chain.from_iterable(rec.to_flat().items())
        args = (len(expected), *expected, *pairs)
        if not await self._r.eval(_HSET_IF_STATE, 1, _sandbox_key(rec.id), *args):
            return False
        await self._follow(rec)
        return True

    async def _follow(self, rec: SandboxRecord) -> None:
        """The indexes follow a transition's winner; a crash before this leaves a deadline
        that due_for_reaping checks against the hash, and quota and paused entries that end
        by themselves."""
        async with self._r.pipeline(transaction=False) as p:
            p.zadd(EXPIRY_INDEX, {rec.id: rec.expires_at})
            p.zadd(IDLE_INDEX, {rec.id: rec.last_activity_at + rec.idle_timeout_s})
            if rec.state in PARKED_STATES:
                p.zrem(_quota_key(rec.owner), rec.id)
            else:
                p.zadd(_quota_key(rec.owner), {rec.id: rec.expires_at})
            if rec.keeps_workspace:
                p.zadd(_paused_key(rec.owner), {rec.id: _paused_entry_end(rec, time.time())})
            else:
                p.zrem(_paused_key(rec.owner), rec.id)
            await p.execute()

    async def start_pause(self, rec: SandboxRecord, limit: int) -> PauseStart:
        # The paused set is counted and held first (it is the owner's key, the record is in
        # another slot); a pause that then loses the record to another caller gives it back.
        now = time.time()
        args = (now, limit, rec.id, _paused_entry_end(rec, now))
        if not await self._r.eval(_PAUSE_SLOT, 1, _paused_key(rec.owner), *args):
            return "full"
        pairs = itertools.chain.from_iterable(rec.to_flat().items())
        if await self._r.eval(_HSET_IF_STATE, 1, _sandbox_key(rec.id), 1, "running", *pairs):
            await self._follow(rec)
            return "moved"
        current = await self.get_sandbox(rec.id)
        if current is None or not current.keeps_workspace:  # else the winner's entry too
            await self._r.zrem(_paused_key(rec.owner), rec.id)
        return "lost"

    async def _update_if_exists(self, sandbox_id: str, fields: Mapping[str, FieldValue]) -> bool:
        return bool(await _hset_if_exists(self._r, _sandbox_key(sandbox_id), fields))

    async def _get_session_blob(self, sandbox_id: str) -> bytes | None:
        return _blob(await self._r.hget(_sandbox_key(sandbox_id), SESSION_KEY_FIELD))

    # -- snapshots ---------------------------------------------------------------------------

    async def reserve_snapshot_bytes(
        self, owner: str, size: int, quota: int
    ) -> ByteReservation | None:
        return await self._hold_bytes(ByteReservation.new(owner, size), quota)

    async def resize_snapshot_reservation(
        self, reservation: ByteReservation, size: int, quota: int
    ) -> ByteReservation | None:
        return await self._hold_bytes(reservation.resized(size), quota)

    async def _hold_bytes(self, reservation: ByteReservation, quota: int) -> ByteReservation | None:
        args = (time.time(), reservation.size, quota, reservation.token, repr(reservation.until))
        held = await self._r.eval(_HOLD_BYTES, 1, _snapshot_quota_key(reservation.owner), *args)
        return reservation if held else None

    async def release_snapshot_bytes(self, reservation: ByteReservation) -> None:
        await self._r.hdel(_snapshot_quota_key(reservation.owner), reservation.token)

    async def snapshot_bytes_held(self, owner: str) -> int:
        return int(await self._r.eval(_BYTES_HELD, 1, _snapshot_quota_key(owner), time.time()))

    async def put_snapshot(
        self, rec: SnapshotRecord, reservation: ByteReservation | None = None
    ) -> None:
        # Hash first, index second: a crash between leaves a snapshot nobody lists, never a
        # listed one that is not there (the index is what listing reads). The quota entry
        # last: it counts only a snapshot whose record exists (see repair_snapshot_quota).
        await self._r.hset(_snapshot_key(rec.id), mapping=_hash(rec.to_flat()))
        await self._r.zadd(SNAPSHOT_INDEX, {rec.id: rec.created_at})
        token = reservation.token if reservation is not None else ""
        await self._r.eval(
            _TAKE_BYTES, 1, _snapshot_quota_key(rec.owner), token, rec.id, rec.size_bytes
        )

    async def repair_snapshot_quota(self) -> None:
        """Each owner's quota hash counts exactly its listed snapshots (reservations apart):
        a crash between a record and its quota entry is the only way they part."""
        listed: dict[str, dict[str, int]] = {}
        for record in await self.list_snapshots():
            listed.setdefault(record.owner, {})[record.id] = record.size_bytes
        async for key in self._r.scan_iter(match="sandcell:snapquota:*", count=500):
            owner = key.decode().removeprefix("sandcell:snapquota:{").removesuffix("}")
            listed.setdefault(owner, {})
        for owner, sizes in listed.items():
            key = _snapshot_quota_key(owner)
            counted = {_text(f) for f in await self._r.hkeys(key)}
            gone = [f for f in counted if not f.startswith("reserved-") and f not in sizes]
            async with self._r.pipeline(transaction=False) as p:
                for snapshot_id, size in sizes.items():
                    p.hsetnx(key, snapshot_id, size)
                if gone:
                    p.hdel(key, *gone)
                await p.execute()

    async def get_snapshot(self, snapshot_id: str) -> SnapshotRecord | None:
        values = await self._r.hmget(_snapshot_key(snapshot_id), _SNAP_FIELDS)
        return _from_hmget(SnapshotRecord, values)

    async def list_snapshots(self, owner: str | None = None) -> list[SnapshotRecord]:
        ids = _members(await self._r.zrange(SNAPSHOT_INDEX, 0, -1))
        rows = await self._hmget_many(list(map(_snapshot_key, ids)), _SNAP_FIELDS)
        records = [_from_hmget(SnapshotRecord, row) for row in rows]
        return [r for r in records if r is not None and owner in (None, r.owner)]

    async def delete_snapshot(self, snapshot_id: str) -> bool:
        key = _snapshot_key(snapshot_id)
        async with self._r.pipeline(transaction=False) as p:
            p.zrem(SNAPSHOT_INDEX, snapshot_id)
            p.hget(key, "owner")
            p.delete(key)
            _, owner, deleted = await p.execute()
        if owner is not None:  # after the record: a crash between counts too much, not too little
            await self._r.hdel(_snapshot_quota_key(owner.decode()), snapshot_id)
        return deleted == 1

    # -- API keys -----------------------------------------------------------------------------

    async def put_api_key(self, rec: ApiKeyRecord) -> None:
        key = _api_key_key(rec.key_hash)
        # Record first, name second: a crash in between leaves a record that no name leads to
        # and whose key was never handed out, rather than a name that leads nowhere.
        await self._r.hset(key, mapping=_hash(rec.to_flat()))
        if not await self._r.hsetnx(API_KEY_NAMES, rec.name, rec.key_hash):
            await self._r.delete(key)
            raise ApiKeyExistsError(f"an API key named {rec.name!r} already exists")

    async def get_api_key_by_hash(self, key_hash: str) -> ApiKeyRecord | None:
        return _from_hmget(ApiKeyRecord, await self._r.hmget(_api_key_key(key_hash), _KEY_FIELDS))

    async def list_api_keys(self) -> list[ApiKeyRecord]:
        hashes = (await self._r.hgetall(API_KEY_NAMES)).values()
        rows = await self._hmget_many([_api_key_key(_text(h)) for h in hashes], _KEY_FIELDS)
        records = [_from_hmget(ApiKeyRecord, row) for row in rows]
        return sorted((r for r in records if r is not None), key=lambda r: r.name)

    async def revoke_api_key(self, name: str) -> bool:
        key_hash = await self._r.hget(API_KEY_NAMES, name)
        if key_hash is None:
            return False
        return bool(await _hset_if_exists(self._r, _api_key_key(_text(key_hash)), {"revoked": 1}))

    # -- manager secrets ----------------------------------------------------------------------

    async def _get_secret_blob(self, name: str) -> bytes | None:
        return _blob(await self._r.get(_secret_key(name)))

    async def _put_secret_blob_if_absent(self, name: str, blob: bytes) -> bytes:
        key = _secret_key(name)
        async with self._r.pipeline(transaction=False) as p:
            # A stored secret is never overwritten, so the GET sees whichever SET NX came first.
            p.set(key, blob, nx=True)
            p.get(key)
            _, stored = await p.execute()
        return stored

    # -- principals' secrets ------------------------------------------------------------------

    async def _put_user_secret_blob(
        self, rec: UserSecretRecord, blob: bytes, limit: int
    ) -> SecretPut:
        fields = {**rec.to_flat(), USER_SECRET_VALUE_FIELD: blob}
        pairs = itertools.chain.from_iterable(fields.items())
        keys = (_user_secret_key(rec.owner, rec.name), _user_secrets_key(rec.owner))
        done = await self._r.eval(_ADD_SEALED, 2, *keys, limit, rec.name, *pairs)
        return cast(SecretPut, _text(done))

    async def _update_user_secret(self, rec: UserSecretRecord, blob: bytes | None) -> bool:
        fields: dict[str, FieldValue] = {
            k: v for k, v in rec.to_flat().items() if k not in ("owner", "name", "created_at")
        }
        if blob is not None:
            fields[USER_SECRET_VALUE_FIELD] = blob
        return bool(await _hset_if_exists(self._r, _user_secret_key(rec.owner, rec.name), fields))

    async def _get_user_secret_blob(self, owner: str, name: str) -> bytes | None:
        return _blob(await self._r.hget(_user_secret_key(owner, name), USER_SECRET_VALUE_FIELD))

    async def get_user_secret(self, owner: str, name: str) -> UserSecretRecord | None:
        values = await self._r.hmget(_user_secret_key(owner, name), _USECRET_FIELDS)
        return _from_hmget(UserSecretRecord, values)

    async def list_user_secrets(self, owner: str) -> list[UserSecretRecord]:
        names = sorted(_text(n) for n in await self._r.smembers(_user_secrets_key(owner)))
        keys = [_user_secret_key(owner, name) for name in names]
        rows = await self._hmget_many(keys, _USECRET_FIELDS)
        return [r for r in (_from_hmget(UserSecretRecord, row) for row in rows) if r is not None]

    async def delete_user_secret(self, owner: str, name: str) -> bool:
        keys = (_user_secret_key(owner, name), _user_secrets_key(owner))
        return bool(await self._r.eval(_DROP_SEALED, 2, *keys, name))

    # -- the node roster ----------------------------------------------------------------------

    async def _put_node(self, rec: NodeRecord) -> NodeRecord:
        flat = rec.to_flat()
        kept = (flat.pop("state"), flat.pop("registered_at"))
        pairs = itertools.chain.from_iterable(flat.items())
        keys = (_node_key(rec.name), NODE_NAMES)
        stored = await self._r.eval(_PUT_NODE, 2, *keys, rec.name, *kept, *pairs)
        fields = {_text(k): v for k, v in zip(stored[::2], stored[1::2], strict=True)}
        return NodeRecord.from_dict(fields)

    async def _set_node_state(self, name: str, state: NodeState) -> bool:
        return bool(await _hset_if_exists(self._r, _node_key(name), {"state": state}))

    async def get_node(self, name: str) -> NodeRecord | None:
        return _from_hmget(NodeRecord, await self._r.hmget(_node_key(name), _NODE_FIELDS))

    async def list_nodes(self) -> list[NodeRecord]:
        names = sorted(_text(n) for n in await self._r.smembers(NODE_NAMES))
        rows = await self._hmget_many([_node_key(name) for name in names], _NODE_FIELDS)
        return [r for r in (_from_hmget(NodeRecord, row) for row in rows) if r is not None]

    async def remove_node(self, name: str) -> bool:
        # The same two steps as a principal's secret: out of the name set, then the hash.
        return bool(await self._r.eval(_DROP_SEALED, 2, _node_key(name), NODE_NAMES, name))

    # -- the audit trail ----------------------------------------------------------------------

    async def append_audits(self, records: Sequence[AuditRecord]) -> None:
        if not records:
            return
        writer = records[0].writer
        if any(rec.writer != writer for rec in records):
            raise AuditConflictError("one run of audit records has one writer")
        await self._r.sadd(AUDIT_WRITERS, writer)  # the index first: no chain unlisted
        args = [GENESIS]
        for rec in records:
            args += [str(rec.seq), rec.prev, rec.hash, rec.to_json(), repr(rec.at)]
        keys = [*_audit_keys(writer), _audit_index(writer)]
        keys += [_audit_index(writer, rec.principal) for rec in records]
        seq = await self._r.eval(_APPEND_AUDIT, len(keys), *keys, *args)
        if int(seq) >= 0:
            raise AuditConflictError(
                f"audit writer {writer!r} is at seq {seq}: seq {records[0].seq} does not"
                " follow it (another process writes under this writer id?)"
            )

    async def audit_head(self, writer: str) -> AuditHead | None:
        fields = ("seq", "hash", "anchor_seq", "anchor_prev")
        values = await self._r.hmget(_audit_keys(writer)[1], fields)
        if None in values:
            return None
        seq, head, anchor_seq, anchor_prev = (_text(v) for v in values if v is not None)
        return AuditHead(writer, int(seq), head, int(anchor_seq), anchor_prev)

    async def audit_writers(self) -> list[str]:
        return sorted(_text(w) for w in await self._r.smembers(AUDIT_WRITERS))

    async def _audit_positions(self, writer: str) -> list[int]:
        fields = [_text(f) for f in await self._r.hkeys(_audit_keys(writer)[0])]
        return sorted(int(f) for f in fields if f.isdigit())

    async def audit_chain(
        self, writer: str, after: int = 0, limit: int = 1000
    ) -> list[tuple[int, AuditRecord | None]]:
        positions = [p for p in await self._audit_positions(writer) if p > after][:limit]
        if not positions:
            return []
        values = await self._r.hmget(_audit_keys(writer)[0], positions)
        return [(p, _audit_record(v)) for p, v in zip(positions, values, strict=True)]

    async def list_audit(self, query: AuditQuery) -> AuditPage:
        """Each writer's time index (its principal's, when the query names one) from the
        query's start, read a batch at a time until it has a page of matches; the writers'
        matches merged in order."""
        matching: list[AuditRecord] = []
        for writer in await self.audit_writers():
            matching += await self._audit_matches(writer, query)
        matching.sort(key=order_key)
        return page_of(matching[: query.limit + 1], query.limit)

    async def _audit_matches(self, writer: str, query: AuditQuery) -> list[AuditRecord]:
        low = max(
            query.since if query.since is not None else float("-inf"),
            parse_cursor(query.after)[0] if query.after is not None else float("-inf"),
        )
        high = f"({query.until!r}" if query.until is not None else "+inf"
        index, records_key = _audit_index(writer, query.principal), _audit_keys(writer)[0]
        found: list[AuditRecord] = []
        offset = 0
        while True:
            seqs = await self._r.zrangebyscore(index, repr(low), high, start=offset, num=AUDIT_SCAN)
            if not seqs:
                return found
            offset += len(seqs)
            values = await self._r.hmget(
                records_key, [_text(s) for s in seqs if isinstance(s, bytes | str)]
            )
            for rec in map(_audit_record, values):
                if rec is None or not query.matches(rec):
                    continue
                if len(found) > query.limit and rec.at > found[-1].at:
                    return found  # a page and one, and every record of the last one's time
                found.append(rec)

    async def prune_audit(self, writer: str, keep_from: int) -> int:
        head = await self.audit_head(writer)
        if head is None or keep_from <= head.anchor_seq:
            return 0
        keep_from = min(keep_from, head.seq + 1)
        records, head_key = _audit_keys(writer)
        if keep_from > head.seq:
            anchor_prev = head.hash
        else:
            last = _audit_record(await self._r.hget(records, str(keep_from - 1)))
            if last is None:
                raise AuditConflictError(
                    f"audit writer {writer!r} has no record {keep_from - 1} to anchor on"
                )
            anchor_prev = last.hash
        # The anchor first: a crash before the deletes leaves records below it, never a
        # chain that starts before its anchor says.
        await self._r.hset(head_key, mapping={"anchor_seq": keep_from, "anchor_prev": anchor_prev})
        gone = [p for p in await self._audit_positions(writer) if p < keep_from]
        for start in range(0, len(gone), 1000):
            batch = [str(p) for p in gone[start : start + 1000]]
            owners = {
                r.principal for r in map(_audit_record, await self._r.hmget(records, batch)) if r
            }
            for index in [_audit_index(writer), *(_audit_index(writer, p) for p in owners)]:
                await self._r.zrem(index, *batch)
            await self._r.hdel(records, *batch)
        return len(gone)

    # -- lifecycle ----------------------------------------------------------------------------

    async def ping(self) -> None:
        await self._r.ping()

    async def close(self) -> None:
        await self._r.aclose()


_R = TypeVar("_R", SandboxRecord, ApiKeyRecord, SnapshotRecord, UserSecretRecord, NodeRecord)


def _from_hmget(cls: type[_R], values: list[Any]) -> _R | None:
    """Rebuild a record from an HMGET of all its fields; None if the hash does not exist."""
    if values[0] is None:
        return None
    return cls.from_dict(dict(zip(cls.fields(), values, strict=True)))
