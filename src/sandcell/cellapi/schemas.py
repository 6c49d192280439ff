"""The daemon's request and response bodies (SPEC §2)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_TIMEOUT_S = 86_400
DEFAULT_MAX_OUTPUT = 1_048_576
MAX_OUTPUT_CAP = 64 * 1_048_576


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class InitRequest(_Strict):
    token: str = Field(min_length=1, max_length=16_384)


class InitResponse(BaseModel):
    status: Literal["initialized"]


class Health(BaseModel):
    status: Literal["ok"]
    initialized: bool
    version: str
    uptime_s: float


class ExecRequest(_Strict):
    command: str | list[str] = Field(
        description="A string runs with /bin/sh -c; an array is executed directly."
    )
    cwd: str | None = Field(None, description="Relative to the workspace.")
    env: dict[str, str] | None = None
    timeout_s: float = Field(60, gt=0, le=MAX_TIMEOUT_S)
    stdin: str | None = None
    max_output_bytes: int = Field(DEFAULT_MAX_OUTPUT, ge=0, le=MAX_OUTPUT_CAP)

    @field_validator("command")
    @classmethod
    def _command_runnable(cls, command: str | list[str]) -> str | list[str]:
        parts = [command] if isinstance(command, str) else command
        if not parts or not parts[0]:
            raise ValueError("command must not be empty")
        if any("\0" in part for part in parts):
            raise ValueError("command must not contain NUL bytes")
        return command

    def argv(self) -> list[str]:
        return ["/bin/sh", "-c", self.command] if isinstance(self.command, str) else self.command


class ExecResult(BaseModel):
    exit_code: int
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    timed_out: bool
    signal: int | None
    duration_s: float


class Entry(BaseModel):
    name: str
    path: str
    type: Literal["file", "dir", "symlink"]
    size: int
    mode: str
    modified: str


class EntryList(BaseModel):
    entries: list[Entry]


class MkdirRequest(_Strict):
    path: str
    parents: bool = True


class MoveRequest(_Strict):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    source: str = Field(alias="from")
    to: str
    overwrite: bool = False


# -- code contexts (SPEC §10) ----------------------------------------------------------------

DEFAULT_CODE_TIMEOUT_S = 300
MAX_CODE_BYTES = 4 * 1_048_576
# A run's reply is encoded whole (its results too): a lower cap than exec's streamed one.
MAX_CODE_OUTPUT = 8 * 1_048_576


class CodeRunRequest(_Strict):
    code: str = Field(max_length=MAX_CODE_BYTES)
    language: str | None = Field(
        None, description="python (default) or bash; with context_id, that context's language"
    )
    context_id: str | None = Field(None, max_length=128)
    timeout_s: float = Field(DEFAULT_CODE_TIMEOUT_S, gt=0, le=MAX_TIMEOUT_S)
    env: dict[str, str] | None = None
    max_output_bytes: int = Field(
        DEFAULT_MAX_OUTPUT, ge=0, le=MAX_CODE_OUTPUT, description="per stream, as exec's"
    )

    @field_validator("code")
    @classmethod
    def _code_has_no_nul(cls, code: str) -> str:
        if "\0" in code:
            raise ValueError("code must not contain NUL bytes")
        return code


class CodeError(BaseModel):
    name: str
    value: str
    traceback: str


class CodeResult(BaseModel):
    """A MIME bundle: the keys present are those the object provided."""

    model_config = ConfigDict(extra="allow")

    is_main_result: bool


class CodeRunResult(BaseModel):
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


class CodeContextRequest(_Strict):
    language: str = "python"
    cwd: str = Field(".", description="Relative to the workspace.")


class CodeContext(BaseModel):
    id: str
    language: str
    cwd: str


class CodeContextList(BaseModel):
    contexts: list[CodeContext]
