"""Where a create goes (SPEC §18): a node chosen from a snapshot of the roster. Pure: no I/O,
the clock and the random source are the caller's.

A node can take a sandbox when it is `active`, has been heard from within the liveness
window, carries every label asked for, and has room: a free cell, and at least the template's
memory, CPUs and disk free. Of those, the nodes holding a warm cell of the template come
first (a claim starts in milliseconds). Among the candidates a few are drawn at random and the
one with the most room left wins ("the power of a few choices"): routers place from snapshots
that may be a heartbeat old, and a rule that always took the emptiest node would send every
router's creates to the same node until its next report; a draw of two or three spreads them
while still steering away from the full ones.

When no node can, the error says why, from the most basic cause down: no node at all, none
with the labels, none of those active and reachable, none large enough for the template ever,
or all of them full right now (the one that passes with time, hence its Retry-After).
"""

from __future__ import annotations

import random
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from sandcell.errors import ErrorCode, ServiceError
from sandcell.store import NodeRecord
from sandcell.store.nodes import LIVENESS_WINDOW_S, liveness

CHOICES = 2  # nodes drawn per placement; the best of them wins
RETRY_AFTER_S = 2  # a full or unreachable cluster may have room by the next heartbeat


@dataclass(frozen=True, slots=True)
class Needs:
    """What one sandbox of a template takes from its node."""

    memory_mb: int
    cpus: float
    disk_mb: int


def _has_labels(node: NodeRecord, labels: Mapping[str, str]) -> bool:
    return all(node.labels.get(key) == value for key, value in labels.items())


# Each resource in one order: cells, memory, CPUs, disk.
def _total(node: NodeRecord) -> tuple[float, ...]:
    return (node.cells, node.memory_mb, node.cpus, node.disk_mb)


def _free(node: NodeRecord) -> tuple[float, ...]:
    return (node.free_cells, node.free_memory_mb, node.free_cpus, node.free_disk_mb)


def _taken(needs: Needs) -> tuple[float, ...]:
    return (1, needs.memory_mb, needs.cpus, needs.disk_mb)


def _could_hold(node: NodeRecord, needs: Needs) -> bool:
    """Whether the node is large enough for one such sandbox at all (empty)."""
    return all(t >= n for t, n in zip(_total(node), _taken(needs), strict=True))


def has_room(node: NodeRecord, needs: Needs) -> bool:
    return all(f >= n for f, n in zip(_free(node), _taken(needs), strict=True))


def room_left(node: NodeRecord, needs: Needs) -> float:
    """The share of its scarcest resource the node keeps after taking the sandbox: nodes of
    different sizes fill in proportion to their size."""
    figures = zip(_free(node), _taken(needs), _total(node), strict=True)
    return min((free - n) / total if total > 0 else 0.0 for free, n, total in figures)


def _best_of_few(
    nodes: Sequence[NodeRecord], needs: Needs, rng: random.Random, choices: int
) -> NodeRecord:
    drawn = rng.sample(list(nodes), min(choices, len(nodes)))  # the draw breaks ties too
    return max(drawn, key=lambda node: room_left(node, needs))


def _refusal(reason: str, message: str, retry: bool, **details: object) -> ServiceError:
    headers = {"Retry-After": str(RETRY_AFTER_S)} if retry else {}
    return ServiceError(
        ErrorCode.OVERLOADED,
        f"no node can take this sandbox: {message}",
        {"reason": reason, **details},
        headers,
    )


def place(
    nodes: Sequence[NodeRecord],
    needs: Needs,
    now: float,
    *,
    labels: Mapping[str, str] | None = None,
    warm: Collection[str] = (),
    rng: random.Random | None = None,
    choices: int = CHOICES,
    window_s: float = LIVENESS_WINDOW_S,
) -> NodeRecord:
    """The node for one create; `warm` names the nodes holding a warm cell of the template.

    Raises 503 OVERLOADED when none can, `details.reason` one of `no_nodes`, `labels`,
    `unavailable` (all draining or unreachable), `too_large`, `full`.
    """
    wanted = dict(labels or {})
    if not nodes:
        raise _refusal("no_nodes", "no node is registered", retry=True)
    labelled = [n for n in nodes if _has_labels(n, wanted)]
    if not labelled:
        shown = ", ".join(f"{k}={v}" for k, v in sorted(wanted.items()))
        raise _refusal("labels", f"no node has the labels {shown}", retry=False, labels=wanted)
    up = [n for n in labelled if n.state == "active" and liveness(n, now, window_s) == "live"]
    if not up:
        draining = sum(n.state == "draining" for n in labelled)
        gone = len(labelled) - draining
        raise _refusal(
            "unavailable",
            f"of {len(labelled)} nodes, {draining} draining and {gone} unreachable",
            retry=True,
            draining=draining,
            unreachable=gone,
        )
    if not any(_could_hold(n, needs) for n in up):
        raise _refusal(
            "too_large",
            f"no node is large enough for {needs.memory_mb} MB, {needs.cpus:g} CPUs and "
            f"{needs.disk_mb} MB of disk",
            retry=False,
        )
    fits = [n for n in up if has_room(n, needs)]
    if not fits:
        raise _refusal("full", f"all {len(up)} available nodes are full", retry=True)
    hot = [n for n in fits if n.name in warm]
    return _best_of_few(hot or fits, needs, rng or random.Random(), choices)  # noqa: S311
