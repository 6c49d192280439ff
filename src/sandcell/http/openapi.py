"""Routes and their OpenAPI document from one table, so the two cannot drift apart."""

from __future__ import annotations

import functools
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

if TYPE_CHECKING:
    from pydantic import BaseModel

Endpoint = Callable[[Request], Awaitable[Response]]


class SchemaModel(Protocol):
    """A body's model: a pydantic model or the daemon's msgspec `Shape`, which offers the
    one classmethod this module reads (the daemon never loads pydantic)."""

    @classmethod
    def model_json_schema(cls, *, ref_template: str) -> dict[str, Any]: ...


@functools.cache
def _error_body() -> type[BaseModel]:
    """SPEC §1's error shape, as a model built when a document is first asked for (the
    daemon builds its document on demand and otherwise never loads pydantic)."""
    from pydantic import BaseModel

    class ErrorDetail(BaseModel):
        code: str
        message: str
        details: dict[str, Any]

    class ErrorBody(BaseModel):
        error: ErrorDetail

    return ErrorBody


@dataclass(frozen=True)
class Query:
    name: str
    schema: dict[str, Any]
    required: bool = False
    description: str = ""


@dataclass(frozen=True)
class Operation:
    """One method on one path. `body`/`response` is a model, a media type, or None."""

    method: str
    path: str
    endpoint: Endpoint
    summary: str
    body: type[SchemaModel] | str | None = None
    response: type[SchemaModel] | str | None = None
    status: int = 200
    query: tuple[Query, ...] = ()
    errors: tuple[int, ...] = ()
    secured: bool = True
    # A secured operation's credentials, by security scheme name (all of them together): the
    # router's own Bearer key unless a façade's table names the headers of its protocol.
    security: tuple[str, ...] = ("bearer",)
    # The model of its error answers: SPEC §1's unless its protocol has its own (a façade).
    error_body: type[BaseModel] | None = None


def routes(operations: Sequence[Operation]) -> list[Route]:
    return [Route(op.path, op.endpoint, methods=[op.method]) for op in operations]


def _content(kind: type[SchemaModel] | str, schemas: dict[str, Any]) -> dict[str, Any]:
    if isinstance(kind, str):
        return {kind: {"schema": {"type": "string", "format": "binary"}}}
    schema = kind.model_json_schema(ref_template="#/components/schemas/{model}")
    schemas.update(schema.pop("$defs", {}))
    schemas[kind.__name__] = schema
    return {"application/json": {"schema": {"$ref": f"#/components/schemas/{kind.__name__}"}}}


_PLACEHOLDER = re.compile(r"{(\w+)(?::\w+)?}")


def _operation(op: Operation, schemas: dict[str, Any]) -> dict[str, Any]:
    op_id = f"{op.endpoint.__name__}_{op.method.lower()}"
    doc: dict[str, Any] = {"summary": op.summary, "operationId": op_id}
    params = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
        for name in _PLACEHOLDER.findall(op.path)
    ]
    if op.query or params:
        doc["parameters"] = params + [
            {
                "name": q.name,
                "in": "query",
                "required": q.required,
                "schema": q.schema,
                "description": q.description,
            }
            for q in op.query
        ]
    if op.body is not None:
        doc["requestBody"] = {"required": True, "content": _content(op.body, schemas)}
    ok: dict[str, Any] = {"description": "success"}
    if op.response is not None:
        ok["content"] = _content(op.response, schemas)
    error_model = op.error_body or _error_body()
    error = {"description": "error", "content": _content(error_model, schemas)}
    codes = sorted({400, 500, *op.errors, *((401,) if op.secured else ())})
    doc["responses"] = {str(op.status): ok, **{str(c): error for c in codes}}
    if op.secured:
        doc["security"] = [{name: [] for name in op.security}]
    return doc


def openapi(
    title: str,
    version: str,
    operations: Sequence[Operation],
    bearer_format: str = "JWT",
    schemes: Mapping[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The document of `operations`; `schemes` are security schemes besides "bearer" that
    some of them name (`Operation.security`), such as a façade's own headers."""
    schemas: dict[str, Any] = {}
    paths: dict[str, dict[str, Any]] = {}
    for op in operations:
        # Starlette's {rest:path} is OpenAPI's {rest}.
        path = _PLACEHOLDER.sub(r"{\1}", op.path)
        paths.setdefault(path, {})[op.method.lower()] = _operation(op, schemas)
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version},
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer", "bearerFormat": bearer_format},
                **(schemes or {}),
            },
        },
    }
