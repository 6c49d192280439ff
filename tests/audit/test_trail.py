"""The serving process's writer (`AuditTrail`) over both stores: noted records reach the store
in batches, chained and verifiable, and the sink gets the same lines; the caller comes from the
request's context and never leaks into another task; a store that refuses the records keeps
them queued and, once the backlog is full, refuses new calls (503) instead of losing them."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from sandcell.audit.chain import AuditLog
from sandcell.audit.records import AuditQuery
from sandcell.audit.trail import CALLER, AuditTrail, Caller, Retention
from sandcell.audit.verify import verify_store
from sandcell.errors import ServiceError
from sandcell.secrets.metrics import SecretUses
from sandcell.store import Store

pytestmark = pytest.mark.anyio


async def records(store: Store) -> list[dict]:
    page = await store.list_audit(AuditQuery(limit=1000))
    return [rec.to_dict() for rec in page.records]


async def test_noted_records_are_stored_in_one_batch_and_verify(
    store: Store, tmp_path: Path
) -> None:
    sink = tmp_path / "logs" / "audit.jsonl"
    trail = AuditTrail(store, "router-a", sink=sink, linger_s=0)
    await trail.start()
    token = CALLER.set(Caller("alice", "ci"))
    try:
        for i in range(5):
            trail.note("exec", sandbox_id="sbx-1", touched={"command_length": i})
        trail.note("file.read", sandbox_id="sbx-1", status=404)
    finally:
        CALLER.reset(token)
    await trail.flush()
    await trail.close()
    stored = await records(store)
    assert [r["seq"] for r in stored] == [1, 2, 3, 4, 5, 6]
    assert {(r["principal"], r["key_name"]) for r in stored} == {("alice", "ci")}
    assert (stored[-1]["outcome"], stored[-1]["status"]) == ("refused", 404)
    report = await verify_store(store)
    assert (report.records, report.findings) == (6, [])
    lines = [json.loads(line) for line in sink.read_text().splitlines()]
    assert lines == stored
    assert sink.stat().st_mode & 0o777 == 0o600


async def test_a_restarted_writer_continues_its_chain(store: Store) -> None:
    first = AuditTrail(store, "router-a", linger_s=0)
    await first.start()
    first.note("sandbox.create", sandbox_id="sbx-1")
    await first.close()  # flushes
    second = AuditTrail(store, "router-a", linger_s=0)
    await second.start()
    second.note("sandbox.delete", sandbox_id="sbx-1")
    await second.close()
    assert [r["seq"] for r in await records(store)] == [1, 2]
    assert (await verify_store(store)).findings == []


async def test_the_caller_of_one_task_is_not_another_tasks(store: Store) -> None:
    trail = AuditTrail(store, "router-a", linger_s=0)
    await trail.start()

    async def request(name: str, ready: asyncio.Event, go: asyncio.Event) -> None:
        CALLER.set(Caller(name, f"{name}-key"))
        ready.set()
        await go.wait()  # the other request sets its caller meanwhile
        trail.note("exec", sandbox_id=f"sbx-{name}")

    events = [(asyncio.Event(), asyncio.Event()) for _ in range(2)]
    tasks = [
        asyncio.create_task(request(name, *ev)) for name, ev in zip(("a", "b"), events, strict=True)
    ]
    for ready, _ in events:
        await ready.wait()
    for _, go in events:
        go.set()
    await asyncio.gather(*tasks)
    trail.note("sandbox.timeout", sandbox_id="sbx-x")  # this task set no caller: the system's
    await trail.close()
    seen = {(r["sandbox_id"], r["principal"], r["key_name"]) for r in await records(store)}
    assert seen == {("sbx-a", "a", "a-key"), ("sbx-b", "b", "b-key"), ("sbx-x", "system", "")}


async def test_egress_and_secret_uses_name_the_sandboxes_owner(store: Store) -> None:
    trail = AuditTrail(store, "router-a", linger_s=0)
    await trail.start()
    trail.remember_owner("sbx-1", "alice")
    trail.egress("sbx-1", "pypi.org", 443, True)
    trail.egress("sbx-1", "evil.example", 80, False)
    uses = SecretUses()
    uses.audit = trail
    uses("sbx-1", "OPENAI_API_KEY", "api.openai.com", "substituted")
    uses("sbx-1", "OPENAI_API_KEY", "evil.example", "refused_host")
    await trail.close()
    got = [(r["action"], r["principal"], r["outcome"], r["touched"]) for r in await records(store)]
    assert got == [
        (
            "egress.decision",
            "alice",
            "ok",
            {"host": "pypi.org", "port": 443, "decision": "allowed"},
        ),
        (
            "egress.decision",
            "alice",
            "refused",
            {"host": "evil.example", "port": 80, "decision": "refused"},
        ),
        (
            "secret.use",
            "alice",
            "ok",
            {"secret": "OPENAI_API_KEY", "host": "api.openai.com", "decision": "substituted"},
        ),
        (
            "secret.use",
            "alice",
            "refused",
            {"secret": "OPENAI_API_KEY", "host": "evil.example", "decision": "refused_host"},
        ),
    ]


async def test_a_store_that_refuses_keeps_the_records_and_closes_the_door(store: Store) -> None:
    """A second process under the same writer id: its appends conflict; the records stay
    queued, and past the backlog's bound every new call is refused with 503."""
    trail = AuditTrail(store, "router-a", linger_s=0, max_backlog=3)
    await trail.start()
    await AuditLog(store, "router-a").append("exec", principal="other", key_name="")
    for _ in range(3):
        trail.note("exec", sandbox_id="sbx-1")
    with pytest.raises(Exception, match="does not follow"):
        await trail.flush()
    assert len(trail) == 3
    with pytest.raises(ServiceError) as refused:
        trail.admit()
    assert refused.value.status == 503
    for task in trail._tasks:
        task.cancel()
    assert [r["principal"] for r in await records(store)] == ["other"]


async def test_retention_runs_with_the_trail(store: Store) -> None:
    log = AuditLog(store, "router-a", clock=lambda: 1000.0)
    for _ in range(5):
        await log.append("exec", principal="alice", key_name="")
    trail = AuditTrail(
        store, "router-b", linger_s=0, retention=Retention(max_records=2, every_s=3600)
    )
    await trail.start()
    deadline = asyncio.get_running_loop().time() + 10
    while len(await records(store)) > 2:  # the first round runs at start
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.01)
    await trail.close()
    assert (await verify_store(store)).findings == []


async def test_a_record_that_cannot_be_one_does_not_block_the_others(store: Store) -> None:
    trail = AuditTrail(store, "router-a", linger_s=0)
    await trail.start()
    trail.note("exec", sandbox_id="sbx-1")
    trail.note("exec", sandbox_id="sbx-1", touched={"stdin": "never kept"})  # no such field
    trail.note("exec", sandbox_id="sbx-2")
    await trail.flush()
    await trail.close()
    assert [r["sandbox_id"] for r in await records(store)] == ["sbx-1", "sbx-2"]
    assert (await verify_store(store)).findings == []
