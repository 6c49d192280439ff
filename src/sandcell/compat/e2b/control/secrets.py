"""E2B's secrets (`e2b.Secret`, `/secrets`) over sandcell's own (SPEC §17): the same store
per principal, the same sealing, values never answered, logged or put in an error.

What E2B's API says and sandcell keeps differ, so the façade maps it (docs/e2b.md, Secrets):
- A name: E2B's (`[a-zA-Z0-9_-]`, lower-cased) is kept as sandcell's, upper-cased with `-` as
  `_`, which is also the variable a sandbox sees (`openai-api-key` is `OPENAI_API_KEY`); it
  comes back as that name lower-cased. One that makes no variable name is refused.
- Hosts: E2B's secret names none, sandcell's must (its value goes to those hosts only), so
  `metadata` carries them, `{"hosts": "api.openai.com,…"}`, and may opt in to `"in":
  "headers,query,body"`; any other metadata key is refused by name (none would be kept).
- `secretID` is `sec_` and a digest of owner, name and creation; `currentVersion` is 1 when
  made and grows with each update (sandcell keeps the current value only).
- In a sandbox: an `envVars` entry set to `Secret.fill(name)` gives it the secret, its
  variable holding the sandbox's placeholder, substituted at egress towards the secret's
  hosts. E2B's `network.rules` header transforms are refused (sandcell adds no headers).
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import time
from typing import Any

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from sandcell.audit.trail import recorded
from sandcell.compat.e2b.bodies import json_object
from sandcell.compat.e2b.control.common import _refused
from sandcell.compat.e2b.control.listing import _page
from sandcell.compat.e2b.gateway import Gateway
from sandcell.errors import ErrorCode, ServiceError
from sandcell.http.bodies import read_body
from sandcell.router import secrets as routes
from sandcell.router.auth import Principal
from sandcell.router.schemas import rfc3339
from sandcell.secrets import shapes
from sandcell.store import Store, UserSecretRecord

ID_PREFIX = "sec_"
MARKER = "${e2b.secrets."  # what `Secret.fill(name)` makes: `${e2b.secrets.<name>}`
_E2B_NAME = re.compile(r"[a-z0-9_-]{1,128}")
_FILLED = re.compile(r"\$\{e2b\.secrets\.([^{}]*)\}")
METADATA_KEYS = ("hosts", "in")


# -- names, ids and views ------------------------------------------------------------------


def sandcell_name(e2b_name: Any, field: str = "name") -> str:
    """The sandcell name (and the sandbox's variable) of an E2B secret name; a 400 naming
    `field` for one E2B refuses, or one that makes no variable name. The name is not quoted:
    a hostile one could be anything."""
    text = e2b_name.strip().lower() if isinstance(e2b_name, str) else ""
    if not _E2B_NAME.fullmatch(text) or text.startswith(ID_PREFIX):
        raise _refused(field, "must be 1-128 letters, digits, '_' or '-', not starting sec_")
    name = text.upper().replace("-", "_")
    if not shapes.valid_name(name):
        raise _refused(
            field,
            f"sandcell gives a secret to a sandbox as the variable of its name, so the name "
            f"starts with a letter or '_' and has at most {shapes.MAX_NAME} characters",
        )
    return name


def secret_id(rec: UserSecretRecord) -> str:
    """Stable for the secret's life, another after a delete and a new create. The creation
    time counts in microseconds, so a store's float spelling cannot change the id."""
    made = round(rec.created_at * 1_000_000)
    digest = hashlib.sha256(f"{rec.owner}\0{rec.name}\0{made}".encode())
    return ID_PREFIX + digest.hexdigest()[:32]


def _version(rec: UserSecretRecord) -> int:
    """1 when made, growing with each update: the milliseconds from creation to the last
    update, plus one (an update here moves `updated_at` on by a millisecond at least)."""
    return 1 + max(0, round((rec.updated_at - rec.created_at) * 1000))


def _metadata(rec: UserSecretRecord) -> dict[str, str]:
    shown = {"hosts": ",".join(rec.hosts)}
    if tuple(rec.places) != ("headers",):
        shown["in"] = ",".join(rec.places)
    return shown


def view(rec: UserSecretRecord) -> dict[str, Any]:
    """E2B's Secret: everything but the value."""
    return {
        "secretID": secret_id(rec),
        "name": rec.name.lower(),
        "currentVersion": _version(rec),
        "metadata": _metadata(rec),
        "createdAt": rfc3339(rec.created_at),
        "updatedAt": rfc3339(rec.updated_at),
    }


def _not_found() -> ServiceError:
    return ServiceError(ErrorCode.NOT_FOUND, "secret not found")


async def _selected(store: Store, owner: str, selector: str) -> UserSecretRecord:
    """The owner's secret by E2B's selector: its `sec_` id, or its name."""
    if selector.strip().lower().startswith(ID_PREFIX):
        wanted = selector.strip().lower()
        for rec in await store.list_user_secrets(owner):
            if secret_id(rec) == wanted:
                return rec
        raise _not_found()
    found = await store.get_user_secret(owner, sandcell_name(selector, "secretID"))
    if found is None:
        raise _not_found()
    return found


# -- bodies --------------------------------------------------------------------------------


def _split(field: str, text: Any) -> list[str]:
    if not isinstance(text, str):
        raise _refused(field, "must be a string")
    return [part.strip() for part in text.split(",") if part.strip()]


def _from_metadata(metadata: Any) -> dict[str, Any]:
    """sandcell's `hosts` and `in` from E2B's metadata; other keys are refused by name."""
    metadata = {} if metadata is None else metadata
    if not isinstance(metadata, dict):
        raise _refused("metadata", "must be an object of strings")
    for key in metadata:
        if key not in METADATA_KEYS:
            raise _refused(
                f"metadata.{str(key)[:64]}",
                'sandcell keeps no metadata on a secret; it reads "hosts" (the hosts its '
                'value may be sent to, comma-separated) and "in" (headers,query,body)',
            )
    if "hosts" not in metadata:
        raise _refused(
            "metadata.hosts",
            "is required: sandcell sends a secret's value only to the hosts it names "
            '(e.g. metadata={"hosts": "api.openai.com"})',
        )
    fields: dict[str, Any] = {"hosts": _split("metadata.hosts", metadata["hosts"])}
    if "in" in metadata:
        fields["in"] = _split("metadata.in", metadata["in"])
    return fields


_FIELDS = {"hosts": "metadata.hosts", "in": "metadata.in", "places": "metadata.in"}


def _checked(model: type[shapes.NewSecret] | type[shapes.SecretUpdate], fields: dict) -> Any:
    """The body as sandcell's own secrets API takes it, with the same checks (size, NUL,
    hosts, `in`); the 400 names E2B's field and never quotes the input."""
    try:
        return model.model_validate(fields)
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        loc = [str(p) for p in first["loc"]]
        field = ".".join([_FIELDS.get(loc[0], loc[0]) if loc else "body", *loc[1:]])
        raise _refused(field, first["msg"].removeprefix("Value error, ")) from None


async def _body(request: Request) -> dict[str, Any]:
    body = json_object(await read_body(request, routes.MAX_BODY))
    value = body.get("value")
    if not isinstance(value, str):
        raise _refused("value", "is required, a string")
    return body


# -- the routes ----------------------------------------------------------------------------


async def create_secret(gateway: Gateway, principal: Principal, request: Request) -> Response:
    body = await _body(request)
    for field in sorted(set(body) - {"name", "value", "metadata"}):
        raise _refused(field, "sandcell does not know this field of E2B's NewSecret")
    name = sandcell_name(body.get("name"))
    fields = {"name": name, "value": body["value"], **_from_metadata(body.get("metadata"))}
    req = _checked(shapes.NewSecret, fields)
    now = time.time()
    rec = UserSecretRecord(principal.name, name, tuple(req.hosts), tuple(req.places), now, now)
    limit = shapes.MAX_SECRETS_PER_PRINCIPAL
    with recorded(gateway.router.audit, "secret.create", touched={"secret": name}):
        done = await gateway.router.store.put_user_secret(rec, req.value.encode(), limit)
        if done == "exists":
            raise ServiceError(ErrorCode.CONFLICT, f"secret {name.lower()} exists")
        if done == "full":
            raise ServiceError(ErrorCode.CONFLICT, f"this key already has {limit} secrets")
    return JSONResponse(view(rec), status_code=201)


async def list_secrets(gateway: Gateway, principal: Principal, request: Request) -> Response:
    records = await gateway.router.store.list_user_secrets(principal.name)
    rows = sorted((view(r) for r in records), key=lambda row: row["name"])
    page, headers = _page(request, rows, lambda row: row["name"])
    return JSONResponse(page, headers=headers)


async def get_secret(gateway: Gateway, principal: Principal, request: Request) -> Response:
    store = gateway.router.store
    return JSONResponse(view(await _selected(store, principal.name, _selector(request))))


async def update_secret(gateway: Gateway, principal: Principal, request: Request) -> Response:
    """E2B's update: a new value, and (when `metadata` is given) new hosts and `in`."""
    store = gateway.router.store
    current = await _selected(store, principal.name, _selector(request))
    body = await _body(request)
    for field in sorted(set(body) - {"value", "metadata"}):
        raise _refused(field, "sandcell does not know this field of E2B's SecretUpdate")
    fields = {"value": body["value"]}
    if body.get("metadata") is not None:
        fields.update(_from_metadata(body["metadata"]))
    req = _checked(shapes.SecretUpdate, fields)
    rec = dataclasses.replace(
        current,
        hosts=tuple(req.hosts) if req.hosts is not None else current.hosts,
        places=tuple(req.places) if req.places is not None else current.places,
        updated_at=max(time.time(), current.updated_at + 0.001),  # the version grows
    )
    with recorded(gateway.router.audit, "secret.update", touched={"secret": rec.name}):
        if not await store.update_user_secret(rec, req.value.encode()):
            raise _not_found()
    return JSONResponse(view(rec))


async def delete_secret(gateway: Gateway, principal: Principal, request: Request) -> Response:
    store = gateway.router.store
    rec = await _selected(store, principal.name, _selector(request))
    with recorded(gateway.router.audit, "secret.delete", touched={"secret": rec.name}):
        if not await store.delete_user_secret(principal.name, rec.name):
            raise _not_found()
    return Response(status_code=204)


def _selector(request: Request) -> str:
    return str(request.path_params["secret_id"])


# -- a sandbox's secrets, from E2B's create ------------------------------------------------


def filled(env: Any) -> tuple[dict[str, Any], list[str]]:
    """E2B's `envVars` without the entries that `Secret.fill` set, and the names of the
    secrets they give the sandbox: the variable of a secret is its own name, which holds
    its placeholder. A fill in any other variable, or inside a longer value, is refused by
    name: sandcell substitutes its placeholder, which only the secret's own variable holds."""
    if not isinstance(env, dict):  # a list or a string: once a 500, spreading it
        raise _refused("envVars", "must be an object of strings")
    kept: dict[str, Any] = {}
    names: list[str] = []
    for var, value in env.items():
        if not isinstance(value, str) or MARKER not in value:
            kept[var] = value
            continue
        field = f"envVars.{str(var)[:64]}"
        match = _FILLED.fullmatch(value)
        if match is None:
            raise _refused(field, "a Secret.fill placeholder must be the whole value")
        name = sandcell_name(match.group(1), field)
        if var != name:
            raise _refused(
                field,
                f"sandcell gives secret {name.lower()} to the sandbox as the variable {name} "
                f"(its name upper-cased, '-' as '_'); set {name} to Secret.fill, or name the "
                "secret after this variable",
            )
        names.append(name)
    return kept, names


RULES_REFUSAL = (
    "sandcell's egress proxy adds no headers: it substitutes a secret's placeholder that the "
    "sandbox sends, towards the hosts the secret names. Give the sandbox the secret with "
    "envVars={NAME: Secret.fill(name)} and send it (docs/e2b.md, Secrets)"
)
