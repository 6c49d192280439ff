"""The sans-I/O core shared by `Sandbox` and `AsyncSandbox`.

Every API operation is written once, as a generator that *describes* its I/O: it yields
effects (`Send` a request, `Read` a chunk of a streamed reply, `Sleep`, `Invoke` a user
callback, run `Blocking` local file I/O) and receives their results. Request building, the
retry policy, error mapping, NDJSON parsing and result assembly all live in those generators
and the helpers below. Two small interpreters in `transport.py` perform the effects, one with
`httpx.Client`, one with `httpx.AsyncClient`; that is the only code that differs.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeVar

from sandcell.client.config import RetryPolicy
from sandcell.client.errors import (
    ConnectionFailedError,
    InternalError,
    InvalidResponseError,
    IsolationUnavailableError,
    NotFoundError,
    RateLimitedError,
    SandboxNotFoundError,
    SandboxUnreachableError,
    ServiceUnavailableError,
    error_from_reply,
)
from sandcell.client.models import CommandResult

T = TypeVar("T")
NDJSON = "application/x-ndjson"
MAX_ERROR_BODY = 1_048_576
UPLOAD_CHUNK = 1_048_576
DEFAULT_KEPT_OUTPUT = 1_048_576  # per stream, in a streamed command's result
FAST_JSON_LINE = 16_384


@dataclass(frozen=True)
class Request:
    """One API call. `idempotent`: safe to repeat even if it may already have run."""

    method: str
    path: str
    params: Mapping[str, str] | None = None
    json: Any = None
    content: bytes | FileUpload | None = None
    headers: Mapping[str, str] | None = None
    timeout: float | None = None  # read timeout; None: the client's default
    stream: bool = False  # hand the reply back unread, for `Read`
    idempotent: bool = True


@dataclass
class Reply:
    status: int
    headers: Mapping[str, str]
    body: bytes = b""
    stream: Any = None  # the interpreter's open response, when the request asked to stream

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError:
            raise InvalidResponseError(
                f"the server's reply is not JSON (HTTP {self.status})", status=self.status
            ) from None


# -- effects: what an operation asks its interpreter to do -----------------------------------


@dataclass(frozen=True)
class Send:
    request: Request


@dataclass(frozen=True)
class Read:
    """The next chunk of a streamed reply; b"" at its end."""

    stream: Any


@dataclass(frozen=True)
class Close:
    stream: Any


@dataclass(frozen=True)
class Sleep:
    seconds: float


@dataclass(frozen=True)
class Invoke:
    """A user callback; the async interpreter awaits it when it returns an awaitable."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]


@dataclass(frozen=True)
class Blocking:
    """Local blocking I/O (files on this machine); the async interpreter runs it in a thread."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]


@dataclass(frozen=True)
class Spawn:
    """Runs another operation alongside this one (a thread, or a task); gives a job."""

    op: Generator[Effect, Any, Any]


@dataclass(frozen=True)
class Join:
    """Waits for a spawned job; its result, or its exception raised here."""

    job: Any


Effect = Send | Read | Close | Sleep | Invoke | Blocking | Spawn | Join
Op = Generator[Effect, Any, T]


# -- the retry policy and error mapping ------------------------------------------------------


def _transient(error: Exception) -> bool:
    """Answers that mean "not done, try again later": nothing ran on the server."""
    if isinstance(error, IsolationUnavailableError):
        return False  # this host cannot enforce the template: waiting does not help
    return isinstance(error, RateLimitedError | ServiceUnavailableError)


def retry_delay(
    policy: RetryPolicy, request: Request, error: Exception, attempt: int
) -> float | None:
    """Seconds to wait before attempt `attempt + 1`, or None to give up and raise."""
    if attempt >= policy.max_retries:
        return None
    if isinstance(error, ConnectionFailedError):
        if error.request_sent and (not request.idempotent or error.timed_out):
            return None  # it may have run (or be running): never do it twice
        return policy.backoff(attempt)
    if _transient(error):
        return policy.retry_after(getattr(error, "retry_after", None), attempt)
    if isinstance(error, InternalError) and request.idempotent:
        return policy.backoff(attempt)  # a server-side hiccup: harmless to ask again
    return None


def call(request: Request, policy: RetryPolicy) -> Op[Reply]:
    """Sends `request`, retrying transient failures; a 2xx reply, or the mapped error."""
    attempt = 0
    while True:
        try:
            reply: Reply = yield Send(request)
        except ConnectionFailedError as exc:
            error: Exception = exc
        else:
            if reply.status < 400:
                return reply
            if reply.stream is not None:
                reply.body = yield from read_all(reply.stream, MAX_ERROR_BODY)
                yield Close(reply.stream)
            error = error_from_reply(reply.status, reply.headers, reply.body)
        delay = retry_delay(policy, request, error, attempt)
        if delay is None:
            raise error
        yield Sleep(delay)
        attempt += 1


def call_json(request: Request, policy: RetryPolicy) -> Op[Any]:
    reply = yield from call(request, policy)
    return reply.json()


def call_deleted(request: Request, policy: RetryPolicy) -> Op[bool]:
    """Sends a DELETE: True if it deleted, False if there was nothing by that name. A sandbox
    that is gone is not "nothing to delete" in it: SandboxNotFoundError still raises."""
    try:
        yield from call(request, policy)
    except SandboxNotFoundError:
        raise
    except NotFoundError:
        return False
    return True


def read_all(stream: Any, limit: int | None = None) -> Op[bytes]:
    parts, size = [], 0
    while chunk := (yield Read(stream)):
        parts.append(chunk)
        size += len(chunk)
        if limit is not None and size >= limit:
            break
    return b"".join(parts)


# -- command output: NDJSON events into a result ---------------------------------------------


class NdjsonDecoder:
    """Splits a byte stream into JSON objects, one per line, whatever the chunking. The
    pieces of a line are joined once, when its end arrives (a streamed command's event can
    span many reads)."""

    def __init__(self) -> None:
        self._head: list[bytes] = []  # the pieces of an unfinished line

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        events = []
        start = 0
        # find() is a memchr, bytes.split(b"\n") a byte-by-byte loop: ~4x slower on a big line.
        while (end := data.find(b"\n", start)) >= 0:
            line = data[start:end]
            if self._head:
                line, self._head = b"".join([*self._head, line]), []
            if line.strip():
                events.append(self._parse(line))
            start = end + 1
        if start < len(data):
            self._head.append(data[start:] if start else data)
        return events

    def close(self) -> list[dict[str, Any]]:
        rest, self._head = b"".join(self._head), []
        return [self._parse(rest)] if rest.strip() else []

    @staticmethod
    def _parse(line: bytes) -> dict[str, Any]:
        try:
            obj = _loads(line)
        except ValueError:
            raise InvalidResponseError(f"not a JSON line: {line[:200]!r}") from None
        if not isinstance(obj, dict):
            raise InvalidResponseError(f"not a JSON object: {line[:200]!r}")
        return obj


def _loads(line: bytes) -> Any:
    """`json.loads`; a big line (a fast command's output) goes through msgspec, ~5x faster,
    imported on the first one only so that small replies do not pay for its import."""
    if len(line) >= FAST_JSON_LINE:
        import msgspec.json

        try:
            return msgspec.json.decode(line)
        except msgspec.DecodeError:
            pass  # what json accepts beyond strict JSON (NaN, huge numbers) gets its say
    return json.loads(line)


class OutputCollector:
    """Accumulates streamed `stdout`/`stderr` events and the final `exit` event.

    A stream delivers every byte; the result keeps the head of each stream up to `cap`
    characters (flagged `*_truncated` past it), so a long stream cannot exhaust memory."""

    def __init__(self, cap: int | None = None) -> None:
        self.cap = DEFAULT_KEPT_OUTPUT if cap is None else cap
        self._parts: dict[str, list[str]] = {"stdout": [], "stderr": []}
        self._size = dict.fromkeys(self._parts, 0)
        self._truncated = dict.fromkeys(self._parts, False)
        self._exit: dict[str, Any] | None = None

    def add(self, event: Mapping[str, Any]) -> tuple[str, str] | None:
        """Records an event; returns (stream, text) for output, None otherwise."""
        kind = event.get("type")
        if kind in self._parts:
            text = str(event.get("data", ""))
            self.keep(kind, text)
            return kind, text
        if kind == "exit":
            self._exit = dict(event)
        return None  # unknown event types are skipped: newer servers may add some

    def keep(self, stream: str, text: str) -> None:
        room = self.cap - self._size[stream]
        if len(text) > room:
            self._truncated[stream] = True
            text = text[: max(room, 0)]
        if text:
            self._parts[stream].append(text)
            self._size[stream] += len(text)

    def result(self) -> CommandResult:
        if self._exit is None:
            raise SandboxUnreachableError(
                "the output stream ended before the command's exit status"
            )
        output: dict[str, Any] = {name: "".join(parts) for name, parts in self._parts.items()}
        for name, cut in self._truncated.items():
            output[f"{name}_truncated"] = cut or bool(self._exit.get(f"{name}_truncated"))
        return CommandResult.from_dict({**self._exit, **output})


# -- uploads: a local file read in bounded chunks --------------------------------------------


ProgressFn = Callable[[int, int | None], Any]


@dataclass(frozen=True)
class FileUpload:
    """A request body read from a local file in chunks (never whole in memory).

    Each attempt opens a fresh `UploadReader`, so a retried upload starts over.
    """

    path: Path
    size: int
    progress: ProgressFn | None = None
    chunk_size: int = UPLOAD_CHUNK

    def open(self) -> UploadReader:
        return UploadReader(self)


class UploadReader:
    def __init__(self, upload: FileUpload) -> None:
        self.upload = upload
        self.done = 0
        self._file: IO[bytes] = open(upload.path, "rb")  # noqa: SIM115 - closed by close()

    def read(self) -> bytes:
        """The next chunk (blocking); exactly `size` bytes in all, as announced."""
        left = self.upload.size - self.done
        if left <= 0:
            return b""
        chunk = self._file.read(min(self.upload.chunk_size, left))
        if not chunk:
            raise OSError(f"{self.upload.path}: the file shrank while being uploaded")
        return chunk

    def advance(self, sent: int) -> Any:
        """Counts `sent` bytes as handed over; returns the progress callback's result."""
        self.done += sent
        if self.upload.progress is not None:
            return self.upload.progress(self.done, self.upload.size)
        return None

    def close(self) -> None:
        self._file.close()


def file_size(path: str | os.PathLike[str]) -> int:
    return os.stat(path).st_size
