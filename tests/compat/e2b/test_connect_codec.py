"""The Connect envelope codec: round trips, and any bytes at all give a message or a 400."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandcell.compat.e2b.envd import connect
from sandcell.errors import ErrorCode, ServiceError

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=10,
)


@given(st.dictionaries(st.text(), json_values, max_size=5))
def test_round_trip(message: dict[str, Any]) -> None:
    assert connect.first_message(connect.envelope(message)) == message


@given(st.binary(max_size=64))
def test_any_bytes_are_a_message_or_a_bad_request(data: bytes) -> None:
    try:
        assert isinstance(connect.first_message(data), dict)
    except ServiceError as exc:
        assert exc.code is ErrorCode.BAD_REQUEST


def test_lengths_flags_and_types_are_checked() -> None:
    body = b'{"a":1}'
    for bad in (
        b"\x00\x00\x00",  # shorter than a header
        b"\x00\x00\x00\x00\x09" + body,  # says 9 bytes, holds 7
        b"\x01\x00\x00\x00\x07" + body,  # compressed
        b"\x00\xff\xff\xff\xff" + body,  # 4 GiB
        b"\x00\x00\x00\x00\x03[1]",  # not an object
    ):
        with pytest.raises(ServiceError) as caught:
            connect.first_message(bad)
        assert caught.value.code is ErrorCode.BAD_REQUEST


def test_stream_ends_with_the_error_that_cut_it() -> None:
    async def events() -> AsyncIterator[dict[str, Any]]:
        yield {"n": 1}
        raise ServiceError(ErrorCode.FILE_NOT_FOUND, "gone")

    async def collect() -> bytes:
        return b"".join([chunk async for chunk in connect.stream(events())])

    data = asyncio.run(collect())
    first = connect.first_message(data)
    rest = data[len(connect.envelope(first)) :]
    assert first == {"n": 1}
    assert rest[0] == connect.END_STREAM
    assert json.loads(rest[5:]) == {"error": {"code": "not_found", "message": "gone"}}
