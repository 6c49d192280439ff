"""The secrets API's bodies and their checks (SPEC §17). Errors name the field, never echo
the value: `parse_model` leaves inputs out of its messages, and the checks here say what is
wrong with a value without quoting it."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from sandcell.errors import ServiceError
from sandcell.network.policy import parse_entry
from sandcell.store import UserSecretRecord

NAME_PATTERN = r"^[A-Z_][A-Z0-9_]*$"  # an environment variable's name, as the cell sees it
MAX_NAME = 64
MAX_VALUE_BYTES = 65_536
MAX_HOSTS = 32
MAX_SECRETS_PER_PRINCIPAL = 100
MAX_SECRETS_PER_SANDBOX = 32
Place = Literal["headers", "query", "body"]
_NAME = re.compile(NAME_PATTERN)
_HEADERS: list[Place] = ["headers"]


def canonical_host(text: str) -> str:
    """A secret's host: a DNS name, exact (no `*.`), optionally `:port`; lower-case, no
    trailing dot. IP addresses are refused: a certificate is minted per name, and SNI never
    carries an address."""
    try:
        entry = parse_entry(text, "hosts")
    except ServiceError as exc:
        raise ValueError(exc.message) from None
    if entry.name is None:
        raise ValueError(f"hosts: {text!r} is an address; a secret names hosts by DNS name")
    if entry.name.startswith("*."):
        raise ValueError(f"hosts: {text!r} is a pattern; a secret names each host exactly")
    if "." not in entry.name and entry.name != "localhost":
        raise ValueError(f"hosts: {text!r} is not a fully qualified name")
    return entry.name + (f":{entry.port}" if entry.port is not None else "")


def host_name(host: str) -> str:
    """The name of a canonical host entry, without its port."""
    name, _, _ = host.partition(":")
    return name


def _hosts(hosts: list[str]) -> list[str]:
    canonical = [canonical_host(h) for h in hosts]
    return list(dict.fromkeys(canonical))  # duplicates once, order kept


def _value(value: str) -> str:
    if len(value.encode()) > MAX_VALUE_BYTES:
        raise ValueError(f"value is longer than {MAX_VALUE_BYTES} bytes")
    if "\x00" in value:
        raise ValueError("value contains a NUL byte")
    return value


def _places(places: list[Place]) -> list[Place]:
    if "headers" not in places:
        raise ValueError('in must include "headers" ("query" and "body" are added to it)')
    return sorted(set(places), key=("headers", "query", "body").index)


SecretName = Annotated[str, Field(min_length=1, max_length=MAX_NAME, pattern=NAME_PATTERN)]
Hosts = Annotated[list[str], Field(min_length=1, max_length=MAX_HOSTS), AfterValidator(_hosts)]
Value = Annotated[str, Field(min_length=1), AfterValidator(_value)]
Places = Annotated[list[Place], Field(min_length=1, max_length=3), AfterValidator(_places)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class NewSecret(_Strict):
    name: SecretName
    value: Value = Field(repr=False)
    hosts: Hosts
    places: Places = Field(default_factory=lambda: list(_HEADERS), alias="in")


class SecretUpdate(_Strict):
    """A rotation: any of the value, the hosts and `in`, the rest kept."""

    value: Value | None = Field(None, repr=False)
    hosts: Hosts | None = None
    places: Places | None = Field(None, alias="in")

    @field_validator("value", "hosts", "places", mode="before")
    @classmethod
    def _not_null(cls, v: object) -> object:
        if v is None:
            raise ValueError("may be left out, not null")
        return v

    @model_validator(mode="after")
    def _something(self) -> SecretUpdate:
        if self.value is None and self.hosts is None and self.places is None:
            raise ValueError('give at least one of "value", "hosts" and "in"')
        return self


class Secret(BaseModel):
    """What the API tells of a secret: everything but its value."""

    name: str
    hosts: list[str]
    places: list[Place] = Field(alias="in")
    created_at: str
    updated_at: str


class SecretList(BaseModel):
    secrets: list[Secret]


def secret_view(record: UserSecretRecord) -> dict:
    from sandcell.router.schemas import rfc3339

    return {
        "name": record.name,
        "hosts": list(record.hosts),
        "in": list(record.places),
        "created_at": rfc3339(record.created_at),
        "updated_at": rfc3339(record.updated_at),
    }


def valid_name(name: str) -> bool:
    return len(name) <= MAX_NAME and _NAME.match(name) is not None
