"""Placement across nodes (SPEC §18): spread, room, labels, warm cells first, nodes skipped,
and refusals that say why. Pure logic: a seeded random source and an injected clock."""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from typing import Any

import pytest

from sandcell.errors import ServiceError
from sandcell.router.placement import Needs, has_room, place
from sandcell.store import NodeRecord
from sandcell.store.nodes import LIVENESS_WINDOW_S

NOW = 1_000_000.0
SMALL = Needs(memory_mb=512, cpus=0.25, disk_mb=1024)


def node(name: str, **fields: Any) -> NodeRecord:
    """An idle node of 64 GiB, 32 CPUs, 128 cells and 200 GiB, heard from just now."""
    values: dict[str, Any] = {
        "address": f"{name}:8701",
        "version": "0.9.0",
        "heartbeat_at": NOW,
        "memory_mb": 65536,
        "cpus": 32.0,
        "cells": 128,
        "disk_mb": 204800,
        "free_memory_mb": 65536,
        "free_cpus": 32.0,
        "free_disk_mb": 204800,
        "live_cells": 0,
        "labels": {"zone": "a"},
    }
    return NodeRecord(name=name, **(values | fields))


def took(rec: NodeRecord, needs: Needs) -> NodeRecord:
    """The node as its next heartbeat reports it, after it started one sandbox."""
    return dataclasses.replace(
        rec,
        free_memory_mb=rec.free_memory_mb - needs.memory_mb,
        free_cpus=rec.free_cpus - needs.cpus,
        free_disk_mb=rec.free_disk_mb - needs.disk_mb,
        live_cells=rec.live_cells + 1,
    )


def run(roster: list[NodeRecord], creates: int, needs: Needs, seed: int = 7, **kw: Any) -> Counter:
    """`creates` placements, each on the roster as updated by the ones before it."""
    rng = random.Random(seed)
    nodes = {n.name: n for n in roster}
    landed: Counter[str] = Counter()
    for _ in range(creates):
        chosen = place(list(nodes.values()), needs, NOW, rng=rng, **kw)
        nodes[chosen.name] = took(nodes[chosen.name], needs)
        landed[chosen.name] += 1
    return landed


def refusal(roster: list[NodeRecord], needs: Needs = SMALL, **kw: Any) -> ServiceError:
    with pytest.raises(ServiceError) as caught:
        place(roster, needs, NOW, rng=random.Random(1), **kw)
    assert (caught.value.status, caught.value.code.value) == (503, "OVERLOADED")
    return caught.value


@pytest.mark.parametrize("seed", range(5))
def test_300_creates_over_three_equal_nodes_land_within_15_percent_of_even(seed: int) -> None:
    landed = run([node("n1"), node("n2"), node("n3")], 300, SMALL, seed)
    assert sum(landed.values()) == 300
    assert all(85 <= landed[n] <= 115 for n in ("n1", "n2", "n3")), landed


def test_three_choices_spread_as_well() -> None:
    landed = run([node("n1"), node("n2"), node("n3")], 300, SMALL, choices=3)
    assert all(85 <= landed[n] <= 115 for n in ("n1", "n2", "n3")), landed


def test_nodes_of_different_sizes_fill_in_proportion() -> None:
    double = {"cells": 256, "memory_mb": 131072, "cpus": 64.0, "disk_mb": 409600}
    big = node("big", **double, **{f"free_{k}": v for k, v in double.items() if k != "cells"})
    landed = run([big, node("n1")], 300, SMALL)
    assert 185 <= landed["big"] <= 215, landed  # twice the size: two thirds


def test_a_full_node_gets_none_and_a_filling_one_stops_at_capacity() -> None:
    full = node("full", live_cells=128)
    low_memory = node("low", free_memory_mb=511)
    landed = run([full, low_memory, node("n1")], 100, SMALL)
    assert landed == {"n1": 100}
    # Three nodes of 4 cells each take 12 creates, then refuse the 13th as full.
    small = [node(f"s{i}", cells=4) for i in range(3)]
    assert run(small, 12, SMALL) == {"s0": 4, "s1": 4, "s2": 4}
    filled = [took(took(took(took(n, SMALL), SMALL), SMALL), SMALL) for n in small]
    assert not any(has_room(n, SMALL) for n in filled)
    error = refusal(filled)
    assert error.details == {"reason": "full"}
    assert error.headers == {"Retry-After": "2"}
    assert "all 3 available nodes are full" in error.message


def test_labels_are_respected() -> None:
    roster = [node("a1"), node("b1", labels={"zone": "b", "gpu": "yes"}), node("b2", labels={})]
    landed = run(roster, 30, SMALL, labels={"zone": "b"})
    assert landed == {"b1": 30}
    assert run(roster, 10, SMALL, labels={}).keys() <= {"a1", "b1", "b2"}
    error = refusal(roster, labels={"zone": "c", "gpu": "yes"})
    assert error.details == {"reason": "labels", "labels": {"zone": "c", "gpu": "yes"}}
    assert "no node has the labels gpu=yes, zone=c" in error.message
    assert error.headers == {}  # waiting does not grow a label


def test_warm_cells_first_while_they_have_room() -> None:
    roster = [node("n1"), node("n2", free_memory_mb=1024), node("n3")]
    # n2 is the fullest, but it holds a warm cell of the template.
    assert run(roster, 2, SMALL, warm={"n2"}) == {"n2": 2}
    # Once its room is gone, the others take the creates.
    after = run(roster, 6, SMALL, warm={"n2"})
    assert after["n2"] == 2 and after["n1"] + after["n3"] == 4
    # Warm cells on a draining or unreachable node do not count.
    gone = [node("n1"), node("n2", state="draining"), node("n3", heartbeat_at=NOW - 60)]
    assert run(gone, 5, SMALL, warm={"n2", "n3"}) == {"n1": 5}


def test_draining_and_unreachable_nodes_are_skipped() -> None:
    late = NOW - LIVENESS_WINDOW_S - 0.1
    roster = [node("d", state="draining"), node("u", heartbeat_at=late), node("ok")]
    assert run(roster, 50, SMALL) == {"ok": 50}
    # Exactly at the window's edge it is still live.
    edge = [node("edge", heartbeat_at=NOW - LIVENESS_WINDOW_S)]
    assert place(edge, SMALL, NOW).name == "edge"
    # A narrower window (a setting) turns it unreachable.
    error = refusal(edge, window_s=1.0)
    assert error.details == {"reason": "unavailable", "draining": 0, "unreachable": 1}
    error = refusal(roster[:2])
    assert error.details == {"reason": "unavailable", "draining": 1, "unreachable": 1}
    assert "of 2 nodes, 1 draining and 1 unreachable" in error.message
    assert error.headers == {"Retry-After": "2"}


def test_a_template_larger_than_any_node_is_refused_as_such() -> None:
    huge = Needs(memory_mb=100_000, cpus=1.0, disk_mb=1024)
    error = refusal([node("n1"), node("n2")], huge)
    assert error.details == {"reason": "too_large"}
    assert "no node is large enough for 100000 MB, 1 CPUs and 1024 MB of disk" in error.message
    assert error.headers == {}


def test_no_nodes_at_all() -> None:
    error = refusal([])
    assert error.details == {"reason": "no_nodes"}
    assert "no node is registered" in error.message


def test_the_reason_is_the_most_basic_one() -> None:
    # Labels first: a matching node that is down says "unavailable", not "labels".
    roster = [node("a", labels={"zone": "x"}, state="draining"), node("b", live_cells=128)]
    assert refusal(roster, labels={"zone": "x"}).details["reason"] == "unavailable"
    # Unavailable before full: the full node is the only one up among the labelled.
    assert refusal(roster).details["reason"] == "full"
    assert refusal(roster, labels={"zone": "y"}).details["reason"] == "labels"


def test_the_same_seed_places_the_same_way() -> None:
    roster = [node("n1"), node("n2"), node("n3")]
    assert run(roster, 40, SMALL, seed=11) == run(roster, 40, SMALL, seed=11)
