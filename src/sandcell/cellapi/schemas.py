"""The daemon's request and response bodies (SPEC §2).

msgspec Structs, not pydantic models: a Struct class costs microseconds to define and
validates in C, so the daemon's start path builds no validators (pydantic spent ~48 ms of
each cell start building these). One declaration per shape serves both validation
(`parse`) and the OpenAPI document (`Shape.model_json_schema`, the interface
`sandcell.http.openapi` reads).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, TypeVar

import msgspec
from msgspec import Meta, Struct, field

from sandcell.cellapi.limits import CODE_TIMEOUT_S, EXEC_TIMEOUT_S, MAX_TIMEOUT_S
from sandcell.errors import ErrorCode, ServiceError

DEFAULT_MAX_OUTPUT = 1_048_576
MAX_OUTPUT_CAP = 64 * 1_048_576


class Shape(Struct, kw_only=True):
    """A JSON body. Requests refuse unknown fields (`Strict`); replies only document."""

    @classmethod
    def model_json_schema(cls, ref_template: str) -> dict[str, Any]:
        """This shape's JSON Schema, the shapes it refers to under `$defs` (as pydantic's)."""
        template = ref_template.replace("{model}", "{name}")
        _, components = msgspec.json.schema_components([cls], ref_template=template)
        schema = components.pop(cls.__name__)
        return {**schema, "$defs": components} if components else schema


class Strict(Shape, forbid_unknown_fields=True):
    pass


ShapeT = TypeVar("ShapeT", bound=Shape)
_WHERE = re.compile(r" - at `\$(.*)`$")


def invalid(field_name: str, message: str) -> ValueError:
    """A check of `__post_init__` that names its field (msgspec only knows the object)."""
    return ValueError(f"{message} - at `$.{field_name}`")


def parse(shape: type[ShapeT], body: bytes) -> ShapeT:
    """The body as `shape`, or a 400 listing what is wrong (`loc`, `msg`, `type`)."""
    if not body:
        raise ServiceError(ErrorCode.BAD_REQUEST, "request body must be a JSON object")
    try:
        return msgspec.json.decode(body, type=shape)
    except msgspec.ValidationError as exc:
        error = _located(str(exc), "value_error")
    except msgspec.DecodeError as exc:
        error = {"loc": [], "msg": f"Invalid JSON: {exc}", "type": "json_invalid"}
    raise ServiceError(ErrorCode.BAD_REQUEST, "request body is not valid", {"errors": [error]})


def _located(message: str, kind: str) -> dict[str, Any]:
    """`Expected int - at `$.pty.cols`` as pydantic's `{"loc": ["pty", "cols"], ...}`."""
    where = _WHERE.search(message)
    loc: list[str] = []
    if where:
        message = message[: where.start()]
        loc = [p for p in re.split(r"[.\[\]]+", where.group(1)) if p]
    if missing := re.fullmatch(r"Object missing required field `(.+)`", message):
        loc, kind = [*loc, missing.group(1)], "missing"
    elif extra := re.fullmatch(r"Object contains unknown field `(.+)`", message):
        loc, kind = [*loc, extra.group(1)], "extra_forbidden"
    return {"loc": loc, "msg": message, "type": kind}


class InitRequest(Strict):
    token: Annotated[str, Meta(min_length=1, max_length=16_384)]


class InitResponse(Shape):
    status: Literal["initialized"]


class Health(Shape):
    status: Literal["ok"]
    initialized: bool
    version: str
    uptime_s: float


Timeout = Annotated[float, Meta(gt=0, le=MAX_TIMEOUT_S)]
Env = dict[str, str] | None


class ExecRequest(Strict):
    command: Annotated[
        str | list[str],
        Meta(description="A string runs with /bin/sh -c; an array is executed directly."),
    ]
    cwd: Annotated[str | None, Meta(description="Relative to the workspace.")] = None
    env: Env = None
    timeout_s: Timeout = EXEC_TIMEOUT_S
    stdin: str | None = None
    max_output_bytes: Annotated[int, Meta(ge=0, le=MAX_OUTPUT_CAP)] = DEFAULT_MAX_OUTPUT

    def __post_init__(self) -> None:
        parts = [self.command] if isinstance(self.command, str) else self.command
        if not parts or not parts[0]:
            raise invalid("command", "command must not be empty")
        if any("\0" in part for part in parts):
            raise invalid("command", "command must not contain NUL bytes")

    def argv(self) -> list[str]:
        return ["/bin/sh", "-c", self.command] if isinstance(self.command, str) else self.command


class ExecResult(Shape):
    exit_code: int
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    timed_out: bool
    signal: int | None
    duration_s: float


class Entry(Shape):
    name: str
    path: str
    type: Literal["file", "dir", "symlink"]
    size: int
    mode: str
    modified: str
    # Beyond SPEC §2.4's entry (what E2B's file info carries): owner and group, a symlink's
    # target, and the user metadata kept as `user.*` xattrs (the prefix dropped).
    uid: int | None = None
    gid: int | None = None
    owner: str | None = None
    group: str | None = None
    target: str | None = None
    metadata: dict[str, str] | None = None


class EntryList(Shape):
    entries: list[Entry]


class DefaultEnv(Strict):
    """The sandbox's default env, replaced whole (`PUT /env`, the manager's)."""

    env: Annotated[dict[str, str], Meta(max_length=4096)]


class MkdirRequest(Strict):
    path: str
    parents: bool = True


class MoveRequest(Strict):
    source: str = field(name="from")
    to: str
    overwrite: bool = False


# -- code contexts (SPEC §10) ----------------------------------------------------------------

DEFAULT_CODE_TIMEOUT_S = CODE_TIMEOUT_S
MAX_CODE_BYTES = 4 * 1_048_576
# A run's reply is encoded whole (its results too): a lower cap than exec's streamed one.
MAX_CODE_OUTPUT = 8 * 1_048_576


class CodeRunRequest(Strict):
    code: Annotated[str, Meta(max_length=MAX_CODE_BYTES)]
    language: Annotated[
        str | None,
        Meta(
            description="python (default), bash, javascript (js) or typescript (ts); "
            "with context_id, that context's language"
        ),
    ] = None
    context_id: Annotated[str, Meta(max_length=128)] | None = None
    timeout_s: Timeout = DEFAULT_CODE_TIMEOUT_S
    env: Env = None
    max_output_bytes: Annotated[
        int, Meta(ge=0, le=MAX_CODE_OUTPUT, description="per stream, as exec's")
    ] = DEFAULT_MAX_OUTPUT

    def __post_init__(self) -> None:
        if "\0" in self.code:
            raise invalid("code", "code must not contain NUL bytes")


class CodeError(Shape):
    name: str
    value: str
    traceback: str


class CodeResult(Shape):
    """A MIME bundle: the keys present are those the object provided (the schema allows
    more properties than this one)."""

    is_main_result: bool


class CodeRunResult(Shape):
    stdout: list[str]
    stderr: list[str]
    results: list[CodeResult]
    error: CodeError | None
    execution_count: int | None
    duration_s: float
    timed_out: bool
    stdout_truncated: bool
    stderr_truncated: bool
    results_truncated: bool


class CodeContextRequest(Strict):
    language: str = "python"
    cwd: Annotated[str, Meta(description="Relative to the workspace.")] = "."


class CodeContext(Shape):
    id: str
    language: str
    cwd: str


class CodeContextList(Shape):
    contexts: list[CodeContext]
