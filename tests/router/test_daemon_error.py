"""The core's one mapping of a daemon's error answer: a SPEC §1 error comes back as the same
error, and an answer that is not one is the sandbox's fault, never a router INTERNAL."""

from __future__ import annotations

import json

import pytest

from sandcell.errors import ErrorCode
from sandcell.router.core import daemon_error


def test_a_spec_error_keeps_its_code_message_and_details() -> None:
    body = {"error": {"code": "NOT_FOUND", "message": "no such file", "details": {"path": "a"}}}
    err = daemon_error(404, json.dumps(body).encode())
    assert (err.code, err.message, err.details) == (
        ErrorCode.NOT_FOUND,
        "no such file",
        {"path": "a"},
    )


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"<html>bad gateway</html>",
        b'{"error": "x"}',
        b'{"error": {"code": "NO_SUCH_CODE", "message": "m"}}',
        b"[]",
    ],
)
def test_anything_else_is_an_unreachable_sandbox(data: bytes) -> None:
    err = daemon_error(502, data)
    assert err.code is ErrorCode.SANDBOX_UNREACHABLE
    assert "502" in err.message
