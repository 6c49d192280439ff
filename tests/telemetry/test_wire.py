"""The trace context and the cell's spans as the host↔cell contract carries them."""

from __future__ import annotations

import json

import pytest

from sandcell.cellapi import spans as wire

VALID = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_a_valid_traceparent_is_read() -> None:
    parsed = wire.parse_traceparent(VALID.encode())
    assert parsed == wire.TraceParent(0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7, 1)
    assert parsed.sampled
    assert wire.format_traceparent(parsed.trace_id, parsed.span_id, True) == VALID.encode()
    # A later version may carry more, after a dash.
    assert wire.parse_traceparent(VALID.replace("00-", "01-", 1).encode() + b"-more") is not None


@pytest.mark.parametrize(
    "bad",
    [
        VALID + "-extra",
        VALID.replace("00-", "ff-", 1),
        VALID.upper(),
        VALID[:-1],
        VALID.replace("4bf9", "4bfg"),
        "00-" + "0" * 32 + "-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-" + "0" * 16 + "-01",
        "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
        "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
        "",
    ],
)
def test_a_bad_traceparent_is_none(bad: str) -> None:
    assert wire.parse_traceparent(bad.encode()) is None


def test_only_one_sampled_traceparent_asks_the_daemon_to_time_its_steps() -> None:
    assert wire.traced([(b"traceparent", VALID.encode())])
    assert not wire.traced([(b"traceparent", VALID[:-2].encode() + b"00")])  # not sampled
    assert not wire.traced([(b"traceparent", VALID.encode())] * 2)
    assert not wire.traced([(b"traceparent", b"junk")])
    assert not wire.traced([])


def test_what_the_daemon_encodes_the_router_decodes_within_bounds() -> None:
    spans = [wire.CellSpan("exec.run", 100 + i, 200 + i, {"exit_code": i}) for i in range(20)]
    data = wire.encode(spans)
    assert len(data) <= wire.MAX_HEADER_BYTES
    decoded = wire.decode(data, 150, 160)
    assert len(decoded) == wire.MAX_SPANS
    assert all(150 <= s.start_ns <= s.end_ns <= 160 for s in decoded)
    assert decoded[0].attributes == {"exit_code": 0}


def test_encode_drops_spans_past_the_header_bound() -> None:
    big = {"exit_code": 10**15}
    spans = [wire.CellSpan("exec.run", 10**18, 10**18 + 1, big)] * wire.MAX_SPANS
    data = wire.encode(spans)
    assert len(data) <= wire.MAX_HEADER_BYTES and json.loads(data)


def test_every_cell_span_carries_numbers_or_flags_only() -> None:
    item = {"n": "file.write", "s": 1, "e": 2, "a": {"bytes": 3}}
    assert wire.decode(json.dumps([item]).encode(), 0, 10)[0].attributes == {"bytes": 3}
    for attributes in ({"bytes": "3"}, {"bytes": [3]}, {"bytes": 2**60}, {"path": 1}):
        item["a"] = attributes
        assert wire.decode(json.dumps([item]).encode(), 0, 10) == []
