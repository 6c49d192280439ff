"""Bounded request bodies and pydantic parsing into the spec's 400 shape.

pydantic is imported by the router's models, never here: the daemon, whose bodies are
msgspec Structs, starts without it."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from itertools import accumulate
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from starlette.requests import HTTPConnection, Request

from sandcell.errors import ErrorCode, ServiceError

if TYPE_CHECKING:
    from pydantic import BaseModel

ModelT = TypeVar("ModelT", bound="BaseModel")
# The deepest nesting of arrays and objects a client's JSON may have. Parsers recurse (the
# stdlib's and msgspec's raise RecursionError near 1,000 levels, pydantic's near 200), and so
# does whatever walks the value later; no body sandcell or a façade's SDK sends comes close.
MAX_JSON_DEPTH = 64
MAX_JSON_CONTAINERS = 10_000  # arrays and objects in one body (no SDK sends a hundred)
# A JSON string once its escaped backslashes and quotes are gone: the brackets inside one do
# not nest.
_JSON_STRING = re.compile(rb'"[^"]*"')
_NOT_BRACKET = bytes(range(256)).translate(None, b"[]{}")
_SQUARE = bytes.maketrans(b"{}", b"[]")  # which kind of bracket is the parser's concern
_STEP = bytes.maketrans(b"[]", b"\x01\xff")  # +1 and -1 as signed bytes
# Scope key of the request's share of a byte budget for buffered bodies (the router sets it
# once it knows who is calling; without one, only `limit` bounds a body).
BODY_BUDGET = "sandcell.body_budget"


class BodyBudget(Protocol):
    def cover(self, size: int) -> None:
        """Holds at least `size` bytes of the budget, or raises (429/503)."""


def too_large(limit: int) -> ServiceError:
    return ServiceError(
        ErrorCode.PAYLOAD_TOO_LARGE, f"request body exceeds {limit} bytes", {"limit_bytes": limit}
    )


def declared_length(request: Request) -> int | None:
    raw = request.headers.get("content-length")
    if raw is None:
        return None
    if not raw.isdigit():
        raise ServiceError(ErrorCode.BAD_REQUEST, "invalid Content-Length")
    return int(raw)


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body, refusing (413) as soon as it passes `limit` bytes; paid for from the
    request's byte budget before it is read (as declared) or as it arrives (chunked)."""
    declared = declared_length(request)
    if declared is not None and declared > limit:
        raise too_large(limit)
    budget: BodyBudget | None = request.scope.get(BODY_BUDGET)
    if budget is not None and declared:
        budget.cover(declared)
    parts, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        if budget is not None:
            budget.cover(size)
        parts.append(chunk)
    return b"".join(parts)


async def stream_body(request: Request) -> AsyncIterator[bytes]:
    async for chunk in request.stream():
        if chunk:
            yield chunk


def _brackets(raw: bytes) -> bytes:
    """The JSON's brackets in order, all made square, outside its strings; C-speed string
    operations over the bytes, no recursion and no objects. On a body that is not JSON they
    are, up to its first error (where any parser stops), the very ones a parser meets."""
    unescaped = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    return _JSON_STRING.sub(b"", unescaped).translate(_SQUARE, _NOT_BRACKET)


def json_value(
    raw: bytes, max_depth: int = MAX_JSON_DEPTH, max_containers: int = MAX_JSON_CONTAINERS
) -> Any:
    """The JSON value in `raw`, or a 400: not JSON, nested deeper than `max_depth` (which
    ends in a RecursionError, a 500, in a parser or in what walks the value), or with more
    than `max_containers` arrays and objects (a megabyte of `[],` costs the parser seconds
    of the event loop, in the garbage collector). Both are checked before parsing."""
    brackets = _brackets(raw)
    # Without its empty pairs (most of them go at once) the body is one level shallower:
    # each of its deepest pairs was one. A run of `max_depth` openers there, the usual
    # attack, is found in one pass; else the levels are summed (a few thousand at most).
    inner = brackets.replace(b"[]", b"")
    deep = b"[" * max_depth in inner
    if not deep and brackets.count(b"[") > max_containers:
        raise ServiceError(
            ErrorCode.BAD_REQUEST,
            f"the JSON has more than {max_containers} arrays and objects",
            {"max_containers": max_containers},
        )
    if deep or (
        len(inner) >= max_depth
        and max(accumulate(memoryview(inner.translate(_STEP)).cast("b"))) >= max_depth
    ):
        raise ServiceError(
            ErrorCode.BAD_REQUEST,
            f"the JSON is nested deeper than {max_depth}",
            {"max_depth": max_depth},
        )
    try:
        return json.loads(raw)
    except ValueError as exc:  # UnicodeDecodeError is one
        raise ServiceError(ErrorCode.BAD_REQUEST, "the body is not JSON") from exc


def parse_model(model: type[ModelT], body: bytes) -> ModelT:
    """The body as `model`, or a 400 listing what is wrong. Needs no `json_value` checks:
    pydantic's parser refuses nesting past ~200 levels itself (a 400 here), and its typed
    fields take no deeper value than their type (the free-form ones are small bodies)."""
    from pydantic import ValidationError  # loaded already: `model` is a pydantic model

    if not body:
        raise ServiceError(ErrorCode.BAD_REQUEST, "request body must be a JSON object")
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        errors = [
            {"loc": [str(p) for p in e["loc"]], "msg": e["msg"], "type": e["type"]}
            for e in exc.errors(include_url=False, include_input=False)
        ]
        raise ServiceError(
            ErrorCode.BAD_REQUEST, "request body is not valid", {"errors": errors}
        ) from None


def path_with_query(connection: HTTPConnection) -> str:
    """The request target exactly as sent (what a request token's `htu` binds)."""
    raw = connection.scope.get("raw_path") or connection.scope["path"].encode()
    query = connection.scope.get("query_string", b"")
    target = raw + (b"?" + query if query else b"")
    return target.decode("latin-1")
