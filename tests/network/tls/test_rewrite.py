"""The streaming rewrite: whatever the chunking, the result is that of the whole stream."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandcell.network.tls.rewrite import Refusal, Rewriter

KEYS = {b"sandcell-secret-A-abc": b"VALUE-ONE", b"v2": b"sandcell-secret-B-x"}


def whole(data: bytes) -> bytes:
    out, pos = [], 0
    while pos < len(data):
        hits = [(data.find(k, pos), k) for k in KEYS if data.find(k, pos) >= 0]
        if not hits:
            break
        index, key = min(hits)
        out += [data[pos:index], KEYS[key]]
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


def test_a_refused_key_raises_even_when_split():
    refusal = Refusal("A", "refused_place", "no")
    rewriter = Rewriter({b"sandcell-secret-A-abc": refusal})
    head = b"a long enough start, then sandcell-sec"
    assert rewriter.feed(head) == head[: len(head) - 20]  # the key's length less one, held
    with pytest.raises(Refusal):
        rewriter.feed(b"ret-A-abc and more")
