"""Bounded request bodies and pydantic parsing into the spec's 400 shape.

pydantic is imported by the router's models, never here: the daemon, whose bodies are
msgspec Structs, starts without it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Protocol, TypeVar

from starlette.requests import Request

from sandcell.errors import ErrorCode, SandcellError

if TYPE_CHECKING:
    from pydantic import BaseModel

ModelT = TypeVar("ModelT", bound="BaseModel")
# Scope key of the request's share of a byte budget for buffered bodies (the router sets it
# once it knows who is calling; without one, only `limit` bounds a body).
BODY_BUDGET = "sandcell.body_budget"


class BodyBudget(Protocol):
    def cover(self, size: int) -> None:
        """Holds at least `size` bytes of the budget, or raises (429/503)."""


def too_large(limit: int) -> SandcellError:
    return SandcellError(
        ErrorCode.PAYLOAD_TOO_LARGE, f"request body exceeds {limit} bytes", {"limit_bytes": limit}
    )


def declared_length(request: Request) -> int | None:
    raw = request.headers.get("content-length")
    if raw is None:
        return None
    if not raw.isdigit():
        raise SandcellError(ErrorCode.BAD_REQUEST, "invalid Content-Length")
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


def parse_model(model: type[ModelT], body: bytes) -> ModelT:
    from pydantic import ValidationError  # loaded already: `model` is a pydantic model

    if not body:
        raise SandcellError(ErrorCode.BAD_REQUEST, "request body must be a JSON object")
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        errors = [
            {"loc": [str(p) for p in e["loc"]], "msg": e["msg"], "type": e["type"]}
            for e in exc.errors(include_url=False, include_input=False)
        ]
        raise SandcellError(
            ErrorCode.BAD_REQUEST, "request body is not valid", {"errors": errors}
        ) from None


def path_with_query(request: Request) -> str:
    """The request target exactly as sent (what a request token's `htu` binds)."""
    raw = request.scope.get("raw_path") or request.scope["path"].encode()
    query = request.scope.get("query_string", b"")
    target = raw + (b"?" + query if query else b"")
    return target.decode("latin-1")
