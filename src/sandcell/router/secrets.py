"""The secrets routes (SPEC §17): a principal's secrets, set, listed, rotated and deleted.

A value goes in and never comes out: no answer, log line or error carries it. Another
principal's secret is 404, as if it did not exist; an admin key manages its own secrets only
(a value it cannot read would be no use to it anyway)."""

from __future__ import annotations

import dataclasses
import time

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from sandcell.audit.trail import recorded
from sandcell.errors import ErrorCode, ServiceError
from sandcell.http.bodies import parse_model, read_body
from sandcell.http.openapi import Operation
from sandcell.secrets import shapes
from sandcell.store import UserSecretRecord

# A value of MAX_VALUE_BYTES, JSON-escaped at worst (\uXXXX per byte), and the rest.
MAX_BODY = 6 * shapes.MAX_VALUE_BYTES + 16_384
_ONE = "/v1/secrets/{name}"


async def _owner(request: Request) -> str:
    return (await request.app.state.router.principal(request)).name


def _not_found(name: str) -> ServiceError:
    return ServiceError(ErrorCode.NOT_FOUND, f"secret {name} not found", {"secret": name})


def _name(request: Request) -> str:
    name = request.path_params["name"]
    if not shapes.valid_name(name):  # cannot exist: the same answer as a missing one
        raise _not_found(name[: shapes.MAX_NAME])
    return name


async def create_secret(request: Request) -> Response:
    owner = await _owner(request)
    req = parse_model(shapes.NewSecret, await read_body(request, MAX_BODY))
    now = time.time()
    rec = UserSecretRecord(owner, req.name, tuple(req.hosts), tuple(req.places), now, now)
    limit = shapes.MAX_SECRETS_PER_PRINCIPAL
    router = request.app.state.router
    with recorded(router.audit, "secret.create", touched={"secret": req.name}):
        done = await router.store.put_user_secret(rec, req.value.encode(), limit)
        if done == "exists":
            raise ServiceError(
                ErrorCode.CONFLICT,
                f"secret {req.name} exists; PUT /v1/secrets/{req.name} rotates it",
                {"secret": req.name},
            )
        if done == "full":
            raise ServiceError(
                ErrorCode.FORBIDDEN, f"this key already has {limit} secrets", {"limit": limit}
            )
    return JSONResponse(shapes.secret_view(rec), status_code=201)


async def list_secrets(request: Request) -> Response:
    owner = await _owner(request)
    records = await request.app.state.router.store.list_user_secrets(owner)
    return JSONResponse({"secrets": [shapes.secret_view(r) for r in records]})


async def update_secret(request: Request) -> Response:
    owner = await _owner(request)
    name = _name(request)
    req = parse_model(shapes.SecretUpdate, await read_body(request, MAX_BODY))
    store = request.app.state.router.store
    current = await store.get_user_secret(owner, name)
    if current is None:
        raise _not_found(name)
    rec = dataclasses.replace(
        current,
        hosts=tuple(req.hosts) if req.hosts is not None else current.hosts,
        places=tuple(req.places) if req.places is not None else current.places,
        updated_at=time.time(),
    )
    value = req.value.encode() if req.value is not None else None
    with recorded(request.app.state.router.audit, "secret.update", touched={"secret": name}):
        if not await store.update_user_secret(rec, value):
            raise _not_found(name)
    return JSONResponse(shapes.secret_view(rec))


async def delete_secret(request: Request) -> Response:
    owner = await _owner(request)
    name = _name(request)
    router = request.app.state.router
    with recorded(router.audit, "secret.delete", touched={"secret": name}):
        if not await router.store.delete_user_secret(owner, name):
            raise _not_found(name)
    return Response(status_code=204)


OPERATIONS = (
    Operation(
        "POST",
        "/v1/secrets",
        create_secret,
        "Store a secret; sandboxes get a placeholder, the egress proxy substitutes the value",
        body=shapes.NewSecret,
        response=shapes.Secret,
        status=201,
        errors=(403, 409, 413),
    ),
    Operation(
        "GET",
        "/v1/secrets",
        list_secrets,
        "List your secrets (never their values)",
        response=shapes.SecretList,
    ),
    Operation(
        "PUT",
        _ONE,
        update_secret,
        "Rotate a secret's value and/or change its hosts (new connections use it)",
        body=shapes.SecretUpdate,
        response=shapes.Secret,
        errors=(404, 413),
    ),
    Operation("DELETE", _ONE, delete_secret, "Delete a secret", status=204, errors=(404,)),
)
