"""The error vocabulary shared by every sandcell HTTP service (SPEC §1).

Each code has one HTTP status; services raise `ServiceError` and a single handler turns it
into `{"error": {"code", "message", "details"}}`.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any


class ErrorCode(StrEnum):
    BAD_REQUEST = "BAD_REQUEST"
    UNAUTHENTICATED = "UNAUTHENTICATED"
    FORBIDDEN = "FORBIDDEN"
    NOT_FOUND = "NOT_FOUND"
    SANDBOX_NOT_FOUND = "SANDBOX_NOT_FOUND"
    FILE_NOT_FOUND = "FILE_NOT_FOUND"
    METHOD_NOT_ALLOWED = "METHOD_NOT_ALLOWED"
    ALREADY_INITIALIZED = "ALREADY_INITIALIZED"
    CONFLICT = "CONFLICT"
    TEMPLATE_NOT_READY = "TEMPLATE_NOT_READY"
    SANDBOX_PAUSED = "SANDBOX_PAUSED"
    PAYLOAD_TOO_LARGE = "PAYLOAD_TOO_LARGE"
    RATE_LIMITED = "RATE_LIMITED"
    INTERNAL = "INTERNAL"
    SANDBOX_UNREACHABLE = "SANDBOX_UNREACHABLE"
    NOT_INITIALIZED = "NOT_INITIALIZED"
    OVERLOADED = "OVERLOADED"
    ISOLATION_UNAVAILABLE = "ISOLATION_UNAVAILABLE"
    SANDBOX_TIMEOUT = "SANDBOX_TIMEOUT"
    NOT_IMPLEMENTED = "NOT_IMPLEMENTED"


STATUS: dict[ErrorCode, int] = {
    ErrorCode.BAD_REQUEST: 400,
    ErrorCode.UNAUTHENTICATED: 401,
    ErrorCode.FORBIDDEN: 403,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.SANDBOX_NOT_FOUND: 404,
    ErrorCode.FILE_NOT_FOUND: 404,
    ErrorCode.METHOD_NOT_ALLOWED: 405,
    ErrorCode.ALREADY_INITIALIZED: 409,
    ErrorCode.CONFLICT: 409,
    ErrorCode.TEMPLATE_NOT_READY: 409,
    ErrorCode.SANDBOX_PAUSED: 409,
    ErrorCode.PAYLOAD_TOO_LARGE: 413,
    ErrorCode.RATE_LIMITED: 429,
    ErrorCode.INTERNAL: 500,
    ErrorCode.SANDBOX_UNREACHABLE: 502,
    ErrorCode.NOT_INITIALIZED: 503,
    ErrorCode.OVERLOADED: 503,
    ErrorCode.ISOLATION_UNAVAILABLE: 503,
    ErrorCode.SANDBOX_TIMEOUT: 504,
    ErrorCode.NOT_IMPLEMENTED: 501,
}


class ServiceError(Exception):
    """An error of a sandcell service (router, daemon, façade) with a stable code, safe to
    show to the caller, answered in SPEC §1's shape. (The SDK's own base class, for what a
    client raises, is `sandcell.SandcellError`: one name per meaning.)"""

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        details: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details or {}
        self.headers = headers or {}

    @property
    def status(self) -> int:
        return STATUS[self.code]

    def body(self) -> dict[str, Any]:
        return error_body(self.code, self.message, self.details)


def error_body(code: ErrorCode, message: str, details: dict[str, Any] | None = None) -> dict:
    return {"error": {"code": code.value, "message": message, "details": details or {}}}


def code_for_status(status: int) -> ErrorCode:
    """The generic code for a status raised by the framework itself (unknown route, ...)."""
    generic = {
        404: ErrorCode.NOT_FOUND,
        405: ErrorCode.METHOD_NOT_ALLOWED,
        413: ErrorCode.PAYLOAD_TOO_LARGE,
        401: ErrorCode.UNAUTHENTICATED,
        403: ErrorCode.FORBIDDEN,
        409: ErrorCode.CONFLICT,
        429: ErrorCode.RATE_LIMITED,
    }
    if status in generic:
        return generic[status]
    return ErrorCode.BAD_REQUEST if 400 <= status < 500 else ErrorCode.INTERNAL
