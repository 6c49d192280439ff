"""Typed exceptions for every error code of the API (SPEC §1), and the mapping from replies.

Every server error arrives as `{"error": {"code", "message", "details"}}`; `error_from_reply`
turns it into the exception class of its code, falling back on the HTTP status for a code this
client does not know yet (a newer server) and for replies that are not sandcell's JSON (a
reverse proxy's HTML page, say).
"""

from __future__ import annotations

import email.utils
import json
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sandcell.errors import ErrorCode

if TYPE_CHECKING:
    from sandcell.client.models import CommandResult


class SandcellError(Exception):
    """Base of every error raised by the client.

    `code` is the server's stable upper-case code (or a client-side one such as
    `CONNECTION_FAILED`), `status` the HTTP status (None when no response came back),
    `message` a human-readable sentence and `details` the server's structured details.
    """

    default_code: str = "ERROR"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        status: int | None = None,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code
        self.status = status
        self.details: dict[str, Any] = dict(details or {})

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, status={self.status}, {self.message!r})"


class BadRequestError(SandcellError):
    default_code = ErrorCode.BAD_REQUEST.value


class AuthenticationError(SandcellError):
    default_code = ErrorCode.UNAUTHENTICATED.value


class ForbiddenError(SandcellError):
    default_code = ErrorCode.FORBIDDEN.value


class NotFoundError(SandcellError):
    default_code = ErrorCode.NOT_FOUND.value


class SandboxNotFoundError(NotFoundError):
    default_code = ErrorCode.SANDBOX_NOT_FOUND.value


class FileNotFoundInSandboxError(NotFoundError):
    """A path inside the sandbox does not exist (named so as not to shadow the builtin)."""

    default_code = ErrorCode.FILE_NOT_FOUND.value


class MethodNotAllowedError(SandcellError):
    default_code = ErrorCode.METHOD_NOT_ALLOWED.value


class ConflictError(SandcellError):
    default_code = ErrorCode.CONFLICT.value


class TemplateNotReadyError(ConflictError):
    """The template's image is not built yet (it may be building: `details["image"]`)."""

    default_code = ErrorCode.TEMPLATE_NOT_READY.value


class SandboxPausedError(ConflictError):
    """The sandbox is paused and was created with auto_resume off: `resume()` it first."""

    default_code = ErrorCode.SANDBOX_PAUSED.value


class AlreadyInitializedError(ConflictError):
    default_code = ErrorCode.ALREADY_INITIALIZED.value


class PayloadTooLargeError(SandcellError):
    default_code = ErrorCode.PAYLOAD_TOO_LARGE.value


class _RetryAfter(SandcellError):
    """An error whose response may carry `Retry-After` (seconds, or None if absent)."""

    def __init__(self, message: str, *, retry_after: float | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.retry_after = retry_after


class RateLimitedError(_RetryAfter):
    default_code = ErrorCode.RATE_LIMITED.value


class InternalError(SandcellError):
    default_code = ErrorCode.INTERNAL.value


class SandboxUnreachableError(SandcellError):
    default_code = ErrorCode.SANDBOX_UNREACHABLE.value


class ServiceUnavailableError(_RetryAfter):
    """503: the service cannot take the request now (base of the three 503 codes)."""

    default_code = "SERVICE_UNAVAILABLE"


class NotInitializedError(ServiceUnavailableError):
    default_code = ErrorCode.NOT_INITIALIZED.value


class OverloadedError(ServiceUnavailableError):
    default_code = ErrorCode.OVERLOADED.value


class IsolationUnavailableError(ServiceUnavailableError):
    """The host cannot enforce an isolation layer the template requires (`details["layer"]`)."""

    default_code = ErrorCode.ISOLATION_UNAVAILABLE.value


class SandboxTimeoutError(SandcellError):
    default_code = ErrorCode.SANDBOX_TIMEOUT.value


class NotSupportedError(SandcellError):
    """501: this server (its backend) does not offer the operation, e.g. metrics on pods."""

    default_code = ErrorCode.NOT_IMPLEMENTED.value


class CommandExitError(SandcellError):
    """`commands.run(..., check=True)` and the command exited non-zero; `.result` has it all."""

    default_code = "COMMAND_EXIT"

    def __init__(self, result: CommandResult) -> None:
        how = "timed out" if result.timed_out else f"exited with {result.exit_code}"
        tail = result.stderr.strip().splitlines()[-1:] if result.stderr.strip() else []
        super().__init__(f"the command {how}" + (f": {tail[0]}" if tail else ""))
        self.result = result
        self.exit_code = result.exit_code


class ConfigurationError(SandcellError, ValueError):
    """The client's own settings are unusable (a URL that is not http:// or https://)."""

    default_code = "INVALID_CONFIG"


class InvalidResponseError(SandcellError):
    """The server's reply is not what the API promises (not JSON, a stream cut short...)."""

    default_code = "INVALID_RESPONSE"


class ConnectionFailedError(SandcellError):
    """No (complete) HTTP response: the server is unreachable, or the connection broke or
    timed out. `request_sent` says whether the request may have reached the server."""

    default_code = "CONNECTION_FAILED"

    def __init__(self, message: str, *, request_sent: bool, timed_out: bool = False) -> None:
        super().__init__(message)
        self.request_sent = request_sent
        self.timed_out = timed_out


BY_CODE: dict[str, type[SandcellError]] = {
    cls.default_code: cls
    for cls in (
        BadRequestError,
        AuthenticationError,
        ForbiddenError,
        NotFoundError,
        SandboxNotFoundError,
        FileNotFoundInSandboxError,
        MethodNotAllowedError,
        ConflictError,
        TemplateNotReadyError,
        SandboxPausedError,
        AlreadyInitializedError,
        PayloadTooLargeError,
        RateLimitedError,
        InternalError,
        SandboxUnreachableError,
        NotInitializedError,
        OverloadedError,
        IsolationUnavailableError,
        SandboxTimeoutError,
        NotSupportedError,
    )
}
BY_STATUS: dict[int, type[SandcellError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: ForbiddenError,
    404: NotFoundError,
    405: MethodNotAllowedError,
    409: ConflictError,
    413: PayloadTooLargeError,
    429: RateLimitedError,
    500: InternalError,
    501: NotSupportedError,
    503: ServiceUnavailableError,
}


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a `Retry-After` header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - (now if now is not None else time.time()), 0.0)


def error_from_reply(status: int, headers: Mapping[str, str], body: bytes) -> SandcellError:
    """The exception for a non-2xx reply."""
    code: str | None = None
    message: str | None = None
    details: dict[str, Any] = {}
    try:
        err = json.loads(body)["error"]
        code, message = str(err["code"]), str(err.get("message") or "")
        details = err.get("details") or {}
        if not isinstance(details, dict):
            details = {"details": details}
    except (ValueError, TypeError, KeyError):
        pass
    cls = BY_CODE.get(code or "") or BY_STATUS.get(status) or SandcellError
    if code is None:
        code = cls.default_code if cls is not SandcellError else f"HTTP_{status}"
        text = body[:200].decode("utf-8", "replace").strip()
        message = f"HTTP {status}" + (f": {text}" if text else "")
    kw: dict[str, Any] = {"code": code, "status": status, "details": details}
    if issubclass(cls, _RetryAfter):
        kw["retry_after"] = parse_retry_after(headers.get("retry-after"))
    return cls(message or code, **kw)
