"""Request bodies of E2B's JSON calls: one object, or a 400."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request

from sandcell.errors import ErrorCode, ServiceError
from sandcell.http.bodies import json_value, read_body


def json_object(raw: bytes) -> dict[str, Any]:
    """The JSON object in `raw` ({} when empty, as Connect sends for an empty message).
    Parsed by `json_value`, bounded in depth and size, so a hostile body is a 400 in the
    caller's shape (Connect's `invalid_argument`, or E2B's REST error), never a 500."""
    value = json_value(raw) if raw.strip() else {}
    if not isinstance(value, dict):
        raise ServiceError(ErrorCode.BAD_REQUEST, "the body must be a JSON object")
    return value


async def json_body(request: Request, limit: int) -> dict[str, Any]:
    return json_object(await read_body(request, limit))
