"""The SDK's NDJSON decoder on big events (a fast command's output): the same objects as
`json.loads` whatever the chunking, the fast path's fallbacks, and its errors."""

from __future__ import annotations

import json
import random

import pytest

from sandcell.client import errors
from sandcell.client.protocol import FAST_JSON_LINE, NdjsonDecoder


def _events(rng: random.Random) -> list[dict[str, object]]:
    alphabet = [chr(c) for c in range(128)] + ["é", "\U0001f600", "\\", '"']
    events: list[dict[str, object]] = []
    for _ in range(12):
        size = rng.choice([0, 10, FAST_JSON_LINE - 30, FAST_JSON_LINE + 1, 200_000])
        text = "".join(rng.choices(alphabet, k=size))
        events.append({"type": rng.choice(["stdout", "stderr"]), "data": text})
    return [*events, {"type": "exit", "exit_code": 0, "signal": None, "duration_s": 1.5}]


def _decode(raw: bytes, sizes: list[int]) -> list[dict[str, object]]:
    decoder, out, at = NdjsonDecoder(), [], 0
    rng = random.Random(len(raw))
    while at < len(raw):
        step = rng.choice(sizes)
        out += decoder.feed(raw[at : at + step])
        at += step
    return out + decoder.close()


@pytest.mark.parametrize("seed", range(4))
def test_big_events_decode_as_json_does_whatever_the_chunking(seed: int):
    events = _events(random.Random(seed))
    for ensure_ascii in (True, False):  # sandcell writes ASCII; raw UTF-8 is JSON too
        raw = b"".join(json.dumps(e, ensure_ascii=ensure_ascii).encode() + b"\n" for e in events)
        for sizes in ([1, 3, 1000], [65_536], [65_536, 7, 300_000], [len(raw)]):
            assert _decode(raw, sizes) == events


def test_a_big_line_json_accepts_but_strict_parsers_refuse_still_decodes():
    """NaN and integers past 64 bits are Python's json extensions: still read, as before."""
    line = {"type": "stdout", "data": "x" * FAST_JSON_LINE, "big": 10**30, "nan": float("nan")}
    (decoded,) = NdjsonDecoder().feed(json.dumps(line).encode() + b"\n")
    assert decoded["big"] == 10**30 and decoded["nan"] != decoded["nan"]
    assert decoded["data"] == line["data"]


def test_a_big_line_that_is_not_json_is_an_error():
    with pytest.raises(errors.InvalidResponseError):
        NdjsonDecoder().feed(b'{"type": "stdout", "data": "' + b"x" * FAST_JSON_LINE + b"\n")
    with pytest.raises(errors.InvalidResponseError):
        NdjsonDecoder().feed(b"[" + b"1," * FAST_JSON_LINE + b"1]\n")  # JSON, not an object
    with pytest.raises(errors.InvalidResponseError):
        NdjsonDecoder().feed(b'{"data": "\xff' + b"x" * FAST_JSON_LINE + b'"}\n')  # not UTF-8
