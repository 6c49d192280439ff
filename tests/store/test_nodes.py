"""The node roster (SPEC §18), run against both backends (SQLite file and a real Redis server):
registration and heartbeats, drains, removal, the liveness window on an injected clock, and
reports a node may not make."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from sandcell.errors import ServiceError
from sandcell.store import NodeRecord, Sealer, Store, open_store
from sandcell.store.nodes import LIVENESS_WINDOW_S, MAX_LABELS, check_node, liveness

from .helpers import T0, race

pytestmark = pytest.mark.anyio


def make_node(name: str = "node-a", **fields: Any) -> NodeRecord:
    """A node of 16 GiB, 8 CPUs, 64 cells and 100 GiB of disk, idle, heard from at T0."""
    values: dict[str, Any] = {
        "address": f"{name}.cluster.internal:8701",
        "version": "0.9.0",
        "heartbeat_at": T0,
        "memory_mb": 16384,
        "cpus": 8.0,
        "cells": 64,
        "disk_mb": 102400,
        "free_memory_mb": 16384,
        "free_cpus": 8.0,
        "free_disk_mb": 102400,
        "live_cells": 0,
        "labels": {"zone": "eu-1", "topology.kubernetes.io/zone": "eu-1a"},
        "registered_at": T0,
    }
    return NodeRecord(name=name, **(values | fields))


async def test_register_round_trips_and_lists_by_name(store: Store) -> None:
    b, a = make_node("node-b"), make_node("node-a", labels={}, address="[fd00::1]:8701")
    assert await store.register_node(b) == b
    assert await store.register_node(a) == a
    assert await store.get_node("node-a") == a
    assert await store.get_node("node-b") == b
    assert await store.get_node("node-c") is None
    assert await store.list_nodes() == [a, b]


async def test_heartbeat_takes_new_figures_but_keeps_state_and_registration(store: Store) -> None:
    await store.register_node(make_node())
    assert await store.set_node_state("node-a", "draining")
    beat = make_node(
        heartbeat_at=T0 + 2,
        registered_at=T0 + 2,  # a restarted node reports its own start: the first one is kept
        state="active",
        free_memory_mb=8192,
        free_cpus=3.5,
        free_disk_mb=50000,
        live_cells=9,
        version="0.9.1",
        labels={"zone": "eu-2"},
        address="10.0.0.7:8701",
    )
    stored = await store.register_node(beat)
    assert stored == dataclasses.replace(beat, state="draining", registered_at=T0)
    assert await store.get_node("node-a") == stored
    assert stored.free_cells == 55


async def test_drain_undrain_and_remove(store: Store) -> None:
    await store.register_node(make_node())
    assert await store.set_node_state("node-a", "draining")
    assert (await store.get_node("node-a")).state == "draining"
    assert await store.set_node_state("node-a", "active")
    assert (await store.get_node("node-a")).state == "active"
    assert not await store.set_node_state("node-x", "draining")
    assert await store.get_node("node-x") is None  # not created by the drain
    with pytest.raises(ValueError, match="invalid node state"):
        await store.set_node_state("node-a", "gone")  # type: ignore[arg-type]

    assert await store.remove_node("node-a")
    assert not await store.remove_node("node-a")
    assert await store.get_node("node-a") is None
    assert await store.list_nodes() == []
    # A node still running comes back with its next heartbeat, as new.
    back = await store.register_node(make_node(heartbeat_at=T0 + 9, registered_at=T0 + 9))
    assert back.registered_at == T0 + 9
    assert [n.name for n in await store.list_nodes()] == ["node-a"]


def test_a_drain_racing_heartbeats_holds(store_url: str, sealer: Sealer) -> None:
    """Replicas heartbeat while one drains: every upsert keeps the stored state in the same
    step that writes the figures, so no heartbeat read before the drain writes it back."""

    async def step(store: Store, i: int) -> None:
        if i == 0:
            await store.register_node(make_node())
            return
        for beat in range(30):
            await store.register_node(make_node(heartbeat_at=T0 + beat, live_cells=i))
            if i == 1 and beat == 10:
                assert await store.set_node_state("node-a", "draining")

    race(store_url, sealer, 4, step)

    async def final() -> NodeRecord | None:
        async with open_store(store_url, sealer) as store:
            return await store.get_node("node-a")

    rec = asyncio.run(final())
    assert rec is not None and rec.state == "draining"


async def test_a_new_node_may_register_drained(store: Store) -> None:
    assert (await store.register_node(make_node(state="draining"))).state == "draining"


async def test_liveness_window_on_an_injected_clock(store: Store) -> None:
    await store.register_node(make_node(heartbeat_at=T0))
    rec = await store.get_node("node-a")
    assert LIVENESS_WINDOW_S == 6.0  # three heartbeats of 2 s
    assert liveness(rec, T0) == "live"
    assert liveness(rec, T0 - 30) == "live"  # a heartbeat from a clock a little ahead
    assert liveness(rec, T0 + LIVENESS_WINDOW_S) == "live"
    assert liveness(rec, T0 + LIVENESS_WINDOW_S + 0.001) == "unreachable"
    assert liveness(rec, T0 + 3, window_s=2.0) == "unreachable"
    # A heartbeat brings it back.
    await store.register_node(make_node(heartbeat_at=T0 + 100))
    assert liveness(await store.get_node("node-a"), T0 + 101) == "live"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("name", ""),
        ("name", "Node-A"),
        ("name", "-a"),
        ("name", "a-"),
        ("name", "a" * 64),
        ("name", "a.b"),
        ("name", "a/b"),
        ("name", "a\x00"),
        ("address", "node-a"),
        ("address", "node-a:0"),
        ("address", "node-a:65536"),
        ("address", "node-a:-1"),
        ("address", "node-a:\uff18\uff17"),  # fullwidth digits: isdigit() but not a port
        ("address", "[zz::1]:80"),
        ("address", "fd00::1:80"),  # an IPv6 host needs its brackets
        ("address", "a b:80"),
        ("address", "x" * 400 + ":80"),
        ("address", ":80"),
        ("version", ""),
        ("version", "1.0 beta"),
        ("version", "v" * 65),
        ("labels", {"": "x"}),
        ("labels", {"zone": "x" * 64}),
        ("labels", {"k" * 64: "x"}),
        ("labels", {"zone": "a b"}),
        ("labels", {"zone": 3}),
        ("labels", {f"k{i}": "v" for i in range(MAX_LABELS + 1)}),
        ("labels", ["zone"]),
        ("memory_mb", -1),
        ("memory_mb", 2**41),
        ("memory_mb", 1.5),
        ("memory_mb", True),
        ("cells", -1),
        ("cells", 10**7),
        ("cpus", -0.5),
        ("cpus", math.nan),
        ("cpus", math.inf),
        ("cpus", "8"),
        ("disk_mb", "100"),
        ("free_memory_mb", 16385),  # more free than there is
        ("free_cpus", 8.5),
        ("free_disk_mb", -5),
        ("live_cells", -1),
        ("heartbeat_at", -1.0),
        ("heartbeat_at", math.nan),
        ("state", "gone"),
    ],
)
async def test_hostile_reports_are_400s_naming_the_field(
    store: Store, field: str, value: Any
) -> None:
    bad = dataclasses.replace(make_node(), **{field: value})
    with pytest.raises(ServiceError) as caught:
        await store.register_node(bad)
    error = caught.value
    assert (error.status, error.code.value) == (400, "BAD_REQUEST")
    assert error.details == {"field": field}
    assert error.message.startswith(f"node {field}: ")
    assert "x" * 60 not in error.message  # the value is not echoed
    assert await store.list_nodes() == []  # nothing half stored


def test_valid_edges_pass() -> None:
    check_node(make_node("a", address="10.1.2.3:1", labels={}))
    check_node(make_node("a" * 63, address="[::1]:65535", labels={"k": ""}))
    edge = {f"example.com/k{i}": "v" * 63 for i in range(MAX_LABELS)}
    check_node(make_node(labels=edge, cpus=0.5, free_cpus=0.0, live_cells=99))  # over: allowed
    assert make_node(live_cells=99).free_cells == 0


async def test_an_older_sqlite_file_gains_the_roster(tmp_path: Path, sealer: Sealer) -> None:
    path = tmp_path / "store.db"
    async with open_store(f"sqlite://{path}", sealer) as store:
        await store.ping()
    with sqlite3.connect(path) as conn:  # as a version-5 file was: no nodes table
        conn.execute("DROP TABLE nodes")
        conn.execute("PRAGMA user_version = 5")
    conn.close()
    async with open_store(f"sqlite://{path}", sealer) as store:
        assert await store.register_node(make_node()) == make_node()
