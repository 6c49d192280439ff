"""`Sandbox.list`'s query and `get_metrics(start, end)` through the unmodified e2b SDK
(SPEC §14.2, issue 27 item 11): pages of `limit` with `next_token`, state, metadata,
template and started-after filters; metrics samples kept in the router and cut to a range."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta

from e2b import Sandbox, SandboxQuery, SandboxState


def test_list_pages_and_filters() -> None:
    tag = uuid.uuid4().hex
    made = [Sandbox.create(timeout=120, metadata={"run": tag, "n": str(i)}) for i in range(3)]
    try:
        query = SandboxQuery(metadata={"run": tag})
        pages = Sandbox.list(query=query, limit=2)
        first = pages.next_items()
        assert len(first) == 2
        assert pages.has_next
        second = pages.next_items()
        assert len(second) == 1
        assert not pages.has_next
        ids = [s.sandbox_id for s in first + second]
        assert sorted(ids) == sorted(s.sandbox_id for s in made)

        one = Sandbox.list(query=SandboxQuery(metadata={"run": tag, "n": "1"})).next_items()
        assert [s.sandbox_id for s in one] == [made[1].sandbox_id]

        made[2].pause()
        paused = SandboxQuery(metadata={"run": tag}, state=[SandboxState.PAUSED])
        assert [s.sandbox_id for s in Sandbox.list(query=paused).next_items()] == [
            made[2].sandbox_id
        ]
        running = SandboxQuery(metadata={"run": tag}, state=[SandboxState.RUNNING])
        assert len(Sandbox.list(query=running).next_items()) == 2

        base = SandboxQuery(metadata={"run": tag}, template="base")
        assert len(Sandbox.list(query=base).next_items()) == 3
        other = SandboxQuery(metadata={"run": tag}, template="code-interpreter-v1")
        assert Sandbox.list(query=other).next_items() == []

        later = SandboxQuery(
            metadata={"run": tag}, started_after=datetime.now(UTC) + timedelta(minutes=5)
        )
        assert Sandbox.list(query=later).next_items() == []
        earlier = SandboxQuery(
            metadata={"run": tag}, started_after=datetime.now(UTC) - timedelta(minutes=5)
        )
        assert len(Sandbox.list(query=earlier).next_items()) == 3
    finally:
        for sbx in made:
            sbx.kill()


def test_get_metrics_keeps_samples_and_honours_the_range() -> None:
    sbx = Sandbox.create(timeout=120)
    try:
        assert len(sbx.get_metrics()) >= 1
        deadline = time.monotonic() + 30
        samples = sbx.get_metrics()
        while time.monotonic() < deadline:
            samples = sbx.get_metrics()
            if len(samples) >= 3 and samples[-1].timestamp - samples[0].timestamp > timedelta(
                seconds=2
            ):
                break
            time.sleep(0.5)
        assert len(samples) >= 3, samples
        stamps = [s.timestamp for s in samples]
        assert stamps == sorted(stamps)
        assert all(s.mem_total > 0 and s.cpu_count >= 1 for s in samples)

        cut = stamps[0] + timedelta(seconds=1)
        after = sbx.get_metrics(start=cut)
        assert after
        assert all(s.timestamp >= cut - timedelta(seconds=1) for s in after)
        assert len(after) < len(sbx.get_metrics())
        before = sbx.get_metrics(start=stamps[0] - timedelta(seconds=1), end=stamps[0])
        assert [s.timestamp for s in before] == [stamps[0]]
    finally:
        sbx.kill()
