"""What only the Redis backend promises: its key layout and its tolerance of stale indexes."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator

import pytest
import redis

from sandcell.store import ApiKeyRecord, Sealer, open_store
from sandcell.store.redis import EXPIRY_INDEX, IDLE_INDEX, STALE_GRACE_S, RedisStore

from .helpers import T0, make_sandbox, new_pem

pytestmark = pytest.mark.anyio


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    with redis.Redis.from_url(redis_url) as c:
        c.flushdb()
        yield c


@pytest.fixture
async def store(redis_url: str, client: redis.Redis, sealer: Sealer) -> AsyncIterator[RedisStore]:
    async with open_store(redis_url, sealer) as s:
        assert isinstance(s, RedisStore)
        yield s


async def test_key_layout(store: RedisStore, client: redis.Redis) -> None:
    await store.put_sandbox(make_sandbox("s1"))
    await store.put_session_key("s1", new_pem())
    await store.put_api_key(ApiKeyRecord("ops", "ops", "ab" * 32, True, T0))
    await store.put_secret_if_absent("bootstrap", b"k")
    assert sorted(k.decode() for k in client.scan_iter()) == [
        "sandcell:apikey:{" + "ab" * 32 + "}",
        "sandcell:quota:{alice}",
        "sandcell:sbx:{s1}",
        "sandcell:secret:{bootstrap}",
        "sandcell:{apikeys}:names",
        "sandcell:{idx}:expiry",
        "sandcell:{idx}:idle",
        "sandcell:{idx}:owner:alice",
    ]
    assert client.hget("sandcell:sbx:{s1}", "state") == b"running"
    assert client.zscore(EXPIRY_INDEX, "s1") == T0 + 3600
    assert client.zscore(IDLE_INDEX, "s1") == T0 + 300


async def test_delete_leaves_nothing_behind(store: RedisStore, client: redis.Redis) -> None:
    await store.put_sandbox(make_sandbox("s1"))
    await store.put_session_key("s1", new_pem())
    assert await store.delete_sandbox("s1")
    assert client.dbsize() == 0


async def test_touch_without_new_timeout_leaves_index_to_the_reaper(
    store: RedisStore, client: redis.Redis
) -> None:
    await store.put_sandbox(make_sandbox("s1"))
    await store.touch("s1", T0 + 200)
    assert client.zscore(IDLE_INDEX, "s1") == T0 + 300  # a lower bound, not yet moved
    assert await store.due_for_reaping(T0 + 400, 10) == []
    assert client.zscore(IDLE_INDEX, "s1") == T0 + 500  # moved to the true idle deadline
    assert await store.due_for_reaping(T0 + 500, 10) == ["s1"]


async def test_reaper_pages_past_entries_that_are_not_due(store: RedisStore) -> None:
    for i in range(5):
        await store.put_sandbox(make_sandbox(f"busy{i}"))
        await store.touch(f"busy{i}", T0 + 250)
    await store.put_sandbox(make_sandbox("idle", last_activity_at=T0 + 1))
    assert await store.due_for_reaping(T0 + 301, 2) == ["idle"]


async def test_indexes_tolerate_a_hash_deleted_behind_their_back(
    store: RedisStore, client: redis.Redis
) -> None:
    now = time.time()  # list_sandboxes prunes by the wall clock, so use real times here
    times = {"created_at": now, "expires_at": now + 3600, "last_activity_at": now}
    await store.put_sandbox(make_sandbox("gone", **times))
    await store.put_sandbox(make_sandbox("kept", **times | {"created_at": now + 1}))
    await store.put_session_key("gone", new_pem())
    client.delete("sandcell:sbx:{gone}")

    assert await store.get_sandbox("gone") is None
    assert await store.get_session_key("gone") is None
    assert [r.id for r in await store.list_sandboxes()] == ["kept"]
    assert [r.id for r in await store.list_sandboxes("alice")] == ["kept"]
    assert await store.count_sandboxes() == 1
    assert await store.count_sandboxes("alice") == 1
    assert await store.due_for_reaping(now + 300, 10) == ["kept"]
    assert not await store.touch("gone", now + 5, idle_timeout_s=60)
    assert not await store.update_state("gone", "failed")
    assert client.exists("sandcell:sbx:{gone}") == 0  # never recreated by those writes

    # Young stale entries stay (they may be a put in flight); old ones are pruned.
    owner_index = "sandcell:{idx}:owner:alice"
    assert all(client.zscore(i, "gone") for i in (EXPIRY_INDEX, IDLE_INDEX, owner_index))
    assert await store.due_for_reaping(now + 3600 + STALE_GRACE_S, 10) == ["kept"]
    assert client.zscore(EXPIRY_INDEX, "gone") is None
    assert client.zscore(IDLE_INDEX, "gone") is None
    client.zadd(owner_index, {"gone": now - STALE_GRACE_S - 1})  # as if written a while ago
    assert await store.count_sandboxes("alice") == 1
    assert client.zscore(owner_index, "gone") is None
    assert client.zscore("sandcell:quota:{alice}", "gone") is None  # its slot is free again

    assert not await store.delete_sandbox("gone")
    assert await store.delete_sandbox("kept")
    assert client.dbsize() == 0


async def test_dangling_api_key_name_is_skipped(store: RedisStore, client: redis.Redis) -> None:
    await store.put_api_key(ApiKeyRecord("a", "alice", "aa" * 32, False, T0))
    await store.put_api_key(ApiKeyRecord("b", "bob", "bb" * 32, False, T0))
    client.delete("sandcell:apikey:{" + "aa" * 32 + "}")
    assert [k.name for k in await store.list_api_keys()] == ["b"]
    assert not await store.revoke_api_key("a")
    assert client.exists("sandcell:apikey:{" + "aa" * 32 + "}") == 0


async def test_a_hash_written_before_persistence_reads_with_defaults(
    store: RedisStore, client: redis.Redis
) -> None:
    await store.put_sandbox(make_sandbox("s1"))
    fields = ("auto_resume", "on_timeout", "lifetime_s", "paused_at", "workspace")
    client.hdel("sandcell:sbx:{s1}", *fields)
    old = await store.get_sandbox("s1")
    assert old is not None and old.auto_resume and old.on_timeout == "delete"
    assert old.workspace == "" and old.lifetime_s == 0
