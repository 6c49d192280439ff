"""The node API's control calls (SPEC §18): what a router asks of a node's manager, as JSON,
answered in the spec's error shape.

This slice has create and delete: `POST /v1/cells` makes a sandbox on this node (the same
manager call `sandcell serve` makes: warm pool first, cold start otherwise) and answers its
record; `DELETE /v1/cells/<id>` deletes one of this node's sandboxes. `GET /v1/node` says
who answers (a router's probe). The router keeps what is per key (limits, reservations,
budgets) in the store as it does on one host; the node only runs cells. A field the node
cannot honour is refused by name, never dropped.
"""

from __future__ import annotations

import re
from typing import Any

from sandcell.errors import ErrorCode, ServiceError
from sandcell.manager.backend import Backend
from sandcell.manager.manager import Manager

from .relay import own_record
from .wire import Request, bad

_CELL = re.compile(r"/v1/cells/([A-Za-z0-9_-]{1,64})")
# Each create field and the kinds of value it takes (None: the template's default).
CREATE_FIELDS: dict[str, tuple[type, ...]] = {
    "owner": (str,),
    "template": (str,),
    "idle_timeout_s": (int, type(None)),
    "max_lifetime_s": (int, type(None)),
    "env": (dict, type(None)),
    "metadata": (dict, type(None)),
}


class Control:
    def __init__(self, name: str, manager: Manager, backend: Backend) -> None:
        self.name = name
        self.manager = manager
        self.backend = backend

    async def call(self, request: Request) -> tuple[int, Any]:
        """The status and JSON payload (None: no body) of one control call."""
        path = request.target.partition("?")[0]
        if path == "/v1/node":
            _allow(request, "GET")
            return 200, {"node": self.name}
        if path == "/v1/cells":
            _allow(request, "POST")
            return 201, await self.create(request.json())
        if (matched := _CELL.fullmatch(path)) is not None:
            _allow(request, "DELETE")
            await self.delete(matched[1])
            return 204, None
        raise ServiceError(ErrorCode.NOT_FOUND, f"no node call {path!r}")

    async def create(self, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise bad("the body must be a JSON object")
        for field, value in body.items():
            if field not in CREATE_FIELDS:
                raise ServiceError(
                    ErrorCode.BAD_REQUEST,
                    f"field {field!r} is not taken by a node's create",
                    {"field": field, "fields": sorted(CREATE_FIELDS)},
                )
            kinds = CREATE_FIELDS[field]
            if not isinstance(value, kinds) or isinstance(value, bool):
                raise ServiceError(
                    ErrorCode.BAD_REQUEST, f"field {field!r} has the wrong type", {"field": field}
                )
            if isinstance(value, dict) and not all(
                isinstance(k, str) and isinstance(v, str) for k, v in value.items()
            ):
                raise ServiceError(
                    ErrorCode.BAD_REQUEST,
                    f"field {field!r} must map strings to strings",
                    {"field": field},
                )
        owner = body.get("owner")
        if not owner:
            raise ServiceError(
                ErrorCode.BAD_REQUEST, "field 'owner' is required", {"field": "owner"}
            )
        record = await self.manager.create_sandbox(
            owner,
            body.get("template", "default"),
            idle_timeout_s=body.get("idle_timeout_s"),
            max_lifetime_s=body.get("max_lifetime_s"),
            env=body.get("env"),
            metadata=body.get("metadata"),
        )
        return record.to_dict()

    async def delete(self, sandbox_id: str) -> None:
        await own_record(self.manager.store, self.backend, sandbox_id)
        await self.manager.delete_sandbox(sandbox_id)


def _allow(request: Request, method: str) -> None:
    if request.method != method:
        raise ServiceError(
            ErrorCode.METHOD_NOT_ALLOWED,
            f"{request.method} is not allowed here",
            {"allowed": [method]},
        )
