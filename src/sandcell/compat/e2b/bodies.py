"""Request bodies of E2B's JSON calls: one object, or a 400."""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request

from sandcell.errors import ErrorCode, SandcellError
from sandcell.http.bodies import read_body


def json_object(raw: bytes) -> dict[str, Any]:
    """The JSON object in `raw` ({} when empty, as Connect sends for an empty message)."""
    try:
        value = json.loads(raw) if raw.strip() else {}
    except (UnicodeDecodeError, ValueError) as exc:
        raise SandcellError(ErrorCode.BAD_REQUEST, "the body is not JSON") from exc
    if not isinstance(value, dict):
        raise SandcellError(ErrorCode.BAD_REQUEST, "the body must be a JSON object")
    return value


async def json_body(request: Request, limit: int) -> dict[str, Any]:
    return json_object(await read_body(request, limit))
