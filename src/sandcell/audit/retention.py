"""Retention: drop each writer's oldest records, by age or beyond a count, and move the
chain's anchor to the first record kept (`Store.prune_audit`), so what remains verifies as a
chain of its own. A writer's records are dropped from the start only, never from the middle."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sandcell.store import Store

PAGE = 1000


async def prune(
    store: Store,
    *,
    max_age_s: float | None = None,
    max_records: int | None = None,
    now: float | None = None,
) -> dict[str, int]:
    """Keep, per writer, the records younger than `max_age_s` and at most the last
    `max_records`; returns how many each writer lost. A record keeps every record after it,
    even an older one (a clock stepped back), so a chain is only ever cut at its start."""
    if max_age_s is not None and max_age_s < 0:
        raise ValueError("max_age_s must not be negative")
    if max_records is not None and max_records < 0:
        raise ValueError("max_records must not be negative")
    cutoff = None if max_age_s is None else (time.time() if now is None else now) - max_age_s
    dropped: dict[str, int] = {}
    for writer in await store.audit_writers():
        head = await store.audit_head(writer)
        if head is None:
            continue
        keep_from = head.anchor_seq
        if max_records is not None:
            keep_from = max(keep_from, head.seq - max_records + 1)
        if cutoff is not None:
            keep_from = max(keep_from, await _first_young(store, writer, keep_from, cutoff))
        dropped[writer] = await store.prune_audit(writer, keep_from)
    return dropped


async def _first_young(store: Store, writer: str, start: int, cutoff: float) -> int:
    """The seq of the writer's first record from `start` on made at or after `cutoff` (one
    past the last if none is); an unreadable record is kept, as evidence."""
    after, last = start - 1, start - 1
    while page := await store.audit_chain(writer, after, PAGE):
        for seq, rec in page:
            if rec is None or rec.at >= cutoff:
                return seq
            last = seq
        after = page[-1][0]
    return last + 1
