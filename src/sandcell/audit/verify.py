"""`verify`: walks each writer's chain as the store holds it and names what does not hold up.

Per record: its `hash` must match its contents (else it was changed, or it sits at another
seq's place: reordered); every seq from the chain's anchor to its head must be there (else
removed); each record's `prev` must be the hash of the record before it (else one of the two
was rewritten, its hash recomputed); the head must name the last record's hash. What it cannot
see: a rewrite of the last records that also rewrites the head (the chain's end, cut or
replaced, together with the head), nor a prune that also moves the anchor; both need a copy of
the head kept outside the store.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from sandcell.audit.records import AuditHead, AuditRecord

if TYPE_CHECKING:
    from sandcell.store import Store

Kind = Literal["changed", "unreadable", "reordered", "removed", "unlinked", "extra", "head"]
PAGE = 1000
# How many failed records are tried at one another's places to tell a swap from an edit:
# tampering is rare, and the search is quadratic in it.
MAX_RELOCATE = 64


@dataclass(frozen=True, slots=True)
class Finding:
    writer: str
    seq: int  # the place in the chain the finding is about
    kind: Kind
    detail: str

    def __str__(self) -> str:
        return f"audit {self.writer} seq {self.seq}: {self.kind}: {self.detail}"


def verify_chain(
    head: AuditHead, stored: Iterable[tuple[int, AuditRecord | None]]
) -> list[Finding]:
    """Findings for one writer's chain: `stored` is (position, record) in position order, from
    the head's anchor on (None where a value no longer reads as a record)."""
    writer, found = head.writer, list[Finding]()
    held = dict(stored)

    def note(seq: int, kind: Kind, detail: str) -> None:
        found.append(Finding(writer, seq, kind, detail))

    # 1. Which seq each stored record really is: its own, or, when its hash fails there, the
    # place among the other failed ones where it holds (a swap); None when nowhere (an edit).
    real: dict[int, int | None] = {}
    failed: list[int] = []
    for pos, rec in held.items():
        if rec is None:
            note(pos, "unreadable", "the stored value is no longer an audit record")
            real[pos] = None
        elif rec.writer != writer:
            note(pos, "changed", f"the record is writer {rec.writer!r}'s")
            real[pos] = None
        elif rec.digest() == rec.hash:
            real[pos] = rec.seq
        else:
            failed.append(pos)
    places = failed if len(failed) <= MAX_RELOCATE else []
    for pos in failed:
        rec = held[pos]
        assert rec is not None
        real[pos] = next(
            (s for s in places if dataclasses.replace(rec, seq=s).digest() == rec.hash), None
        )
        if real[pos] is None:
            note(pos, "changed", "its hash does not match its contents")
    for pos, seq in real.items():
        if seq is not None and seq != pos:
            note(pos, "reordered", f"holds the record of seq {seq}")
        if pos > head.seq:
            note(pos, "extra", f"stored after the head (seq {head.seq})")

    # 2. Every seq from the anchor to the head is somewhere (a changed record keeps its place).
    present = {s if s is not None else pos for pos, s in real.items()}
    missing = [s for s in range(head.anchor_seq, head.seq + 1) if s not in present]
    for first, last in _runs(missing):
        span = f"seq {first}" if first == last else f"seqs {first} to {last}"
        cut = f" (the chain's end: the head records seq {head.seq})" if last == head.seq else ""
        note(first, "removed", f"{span} missing{cut}")

    # 3. Links: each record's prev is the hash of the one before it (the anchor's for the
    # first); a changed record counts at its place with the hash it carries.
    by_seq = {(s if s is not None else pos): (held[pos], s is not None) for pos, s in real.items()}
    for seq in sorted(by_seq):
        rec, intact = by_seq[seq]
        if rec is None or not intact:
            continue  # unreadable or changed: reported already
        before = by_seq.get(seq - 1, (None, False))[0]
        if seq == head.anchor_seq:
            expected = head.anchor_prev
        elif before is not None:
            expected = before.hash
        else:
            continue  # the one before is removed or unreadable: reported already
        if rec.prev != expected:
            note(seq, "unlinked", f"its prev is not the hash of seq {seq - 1}: one was rewritten")
    last_rec = by_seq.get(head.seq, (None, False))[0]
    if head.hash and last_rec is not None and last_rec.hash != head.hash:
        note(head.seq, "head", "the head names another hash: the last record was rewritten")
    return sorted(found, key=lambda f: (f.seq, f.kind))


def _runs(seqs: list[int]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for s in seqs:
        if runs and runs[-1][1] == s - 1:
            runs[-1] = (runs[-1][0], s)
        else:
            runs.append((s, s))
    return runs


@dataclass(frozen=True, slots=True)
class Report:
    writers: int
    records: int
    findings: list[Finding]


async def verify_store(store: Store) -> Report:
    """Every writer's chain in `store`, read page by page."""
    findings: list[Finding] = []
    records = 0
    writers = await store.audit_writers()
    for writer in writers:
        head = await store.audit_head(writer)
        stored: list[tuple[int, AuditRecord | None]] = []
        after = 0 if head is None else head.anchor_seq - 1
        while page := await store.audit_chain(writer, after, PAGE):
            stored += page
            after = page[-1][0]
        records += len(stored)
        if head is None:
            findings.append(Finding(writer, 0, "head", "records but no head"))
            last = stored[-1][0] if stored else 0
            head = AuditHead(writer, last, "", stored[0][0] if stored else 1)
        findings += verify_chain(head, stored)
    return Report(len(writers), records, findings)
