"""The streaming rewrite: whatever the chunking, the result is that of the whole stream."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sandcell.network.tls.rewrite import Refusal, Rewriter

KEYS = {b"sandcell-secret-A-abc": b"VALUE-ONE", b"v2": b"sandcell-secret-B-x"}


def whole(data: bytes, keys: dict[bytes, bytes] = KEYS) -> bytes:
    out, pos = [], 0
    while pos < len(data):
        hits = [(data.find(k, pos), k) for k in keys if data.find(k, pos) >= 0]
        if not hits:
            break
        index, key = min(hits)
        out += [data[pos:index], keys[key]]
        pos = index + len(key)
    return b"".join(out) + data[pos:]


pieces = st.lists(st.sampled_from([b"x", b"sandcell-", b"v", b"2", *KEYS]), max_size=40)


@settings(max_examples=300, deadline=None)
@given(parts=pieces, cuts=st.lists(st.integers(0, 400), max_size=12))
def test_any_chunking_rewrites_as_the_whole(parts, cuts):
    data = b"".join(parts)
    bounds = sorted({0, len(data), *(c for c in cuts if c < len(data))})
    rewriter = Rewriter(dict(KEYS))
    out = b"".join(rewriter.feed(data[a:b]) for a, b in itertools.pairwise(bounds))
    assert out + rewriter.flush() == whole(data)


# Keys that begin with what they end with (so the bytes held are not always the last ones).
SELF_OVERLAPPING = {b"aaab": b"X", b"abaabb": b"YY"}


@settings(max_examples=1000, deadline=None)
@given(
    parts=st.lists(st.sampled_from([b"a", b"b", b"ab", b"aa", b"x"]), max_size=30),
    cuts=st.lists(st.integers(0, 60), max_size=12),
)
# "xxaab" | "aabb": the chunk's end "aab" begins no key, its "ab" begins "abaabb".
@example(parts=[b"x", b"x", b"aa", b"b", b"aa", b"b", b"b"], cuts=[5])
def test_the_pieces_of_bytearray_chunks_are_the_whole_too(parts, cuts):
    """As h11 hands body chunks in: bytearrays, answered with views of them."""
    data = b"".join(parts)
    bounds = sorted({0, len(data), *(c for c in cuts if c < len(data))})
    rewriter = Rewriter(dict(SELF_OVERLAPPING))
    out = bytearray()
    for a, b in itertools.pairwise(bounds):
        for piece in rewriter.parts(bytearray(data[a:b])):
            out += piece
    assert bytes(out) + rewriter.flush() == whole(data, SELF_OVERLAPPING)


def test_a_bulk_chunk_without_a_match_is_passed_as_a_view_not_copied():
    rewriter = Rewriter({b"the-secret-value": b"sandcell-secret-X-1"})
    chunk = bytearray(b"z" * 262_144)
    (piece,) = rewriter.parts(chunk)
    assert isinstance(piece, memoryview) and piece.obj is chunk and len(piece) == len(chunk)
    # Only what may begin the key is held back for the next chunk.
    assert [bytes(p) for p in rewriter.parts(bytearray(b"...the-sec"))] == [b"..."]
    assert rewriter.flush() == b"the-sec"


def test_a_refused_key_raises_even_when_split():
    refusal = Refusal("A", "refused_place", "no")
    rewriter = Rewriter({b"sandcell-secret-A-abc": refusal})
    head = b"a long enough start, then sandcell-sec"
    assert rewriter.feed(head) == head.removesuffix(b"sandcell-sec")  # what may begin it, held
    with pytest.raises(Refusal):
        rewriter.feed(b"ret-A-abc and more")


@settings(max_examples=500, deadline=None)
@given(parts=pieces, cuts=st.lists(st.integers(0, 400), max_size=12))
def test_a_fixed_buffer_is_read_only_up_to_its_end(parts, cuts):
    """As the relay hands in its read buffer: the chunk, then bytes of an earlier read
    (here whole keys) past `end`, which must neither match nor be held."""
    data = b"".join(parts)
    bounds = sorted({0, len(data), *(c for c in cuts if c < len(data))})
    rewriter = Rewriter(dict(KEYS))
    out = bytearray()
    for a, b in itertools.pairwise(bounds):
        buffer = bytearray(data[a:b] + b"sandcell-secret-A-abc v2")
        for piece in rewriter.parts(buffer, b - a):
            out += piece
    assert bytes(out) + rewriter.flush() == whole(data)
