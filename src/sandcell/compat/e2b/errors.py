"""sandcell's errors in E2B's shapes, so the e2b SDK raises its own typed exceptions.

The control API and envd's REST routes answer `{"code": <status>, "message": ...}` with the
HTTP status; Connect RPC carries a lower-case code name (`not_found`, ...) that the SDK maps
to `NotFoundException`, `AuthenticationException`, `TimeoutException` and so on. Each kind
of route is wrapped once with its mapper (see the operation tables), never per handler.
"""

from __future__ import annotations

from pydantic import BaseModel
from starlette.responses import JSONResponse

from sandcell.errors import STATUS, ErrorCode, ServiceError

CONNECT_CODES: dict[ErrorCode, str] = {
    ErrorCode.BAD_REQUEST: "invalid_argument",
    ErrorCode.UNAUTHENTICATED: "unauthenticated",
    ErrorCode.FORBIDDEN: "permission_denied",
    ErrorCode.NOT_FOUND: "not_found",
    ErrorCode.SANDBOX_NOT_FOUND: "not_found",
    ErrorCode.FILE_NOT_FOUND: "not_found",
    ErrorCode.METHOD_NOT_ALLOWED: "unimplemented",
    ErrorCode.CONFLICT: "already_exists",
    ErrorCode.ALREADY_INITIALIZED: "already_exists",
    ErrorCode.SANDBOX_PAUSED: "failed_precondition",
    ErrorCode.TEMPLATE_NOT_READY: "failed_precondition",
    ErrorCode.PAYLOAD_TOO_LARGE: "resource_exhausted",
    ErrorCode.RATE_LIMITED: "resource_exhausted",
    ErrorCode.SANDBOX_UNREACHABLE: "unavailable",
    ErrorCode.NOT_INITIALIZED: "unavailable",
    ErrorCode.OVERLOADED: "unavailable",
    ErrorCode.ISOLATION_UNAVAILABLE: "unavailable",
    ErrorCode.SANDBOX_TIMEOUT: "deadline_exceeded",
    ErrorCode.NOT_IMPLEMENTED: "unimplemented",
}
# Connect's own HTTP statuses for a unary error (connectrpc.com/docs/protocol).
CONNECT_STATUS = {
    "invalid_argument": 400,
    "failed_precondition": 400,
    "unauthenticated": 401,
    "permission_denied": 403,
    "not_found": 404,
    "already_exists": 409,
    "resource_exhausted": 429,
    "unavailable": 503,
    "deadline_exceeded": 504,
    "unimplemented": 501,
    "internal": 500,
}


class RestError(BaseModel):
    """E2B's error body on the control API and envd's REST routes."""

    code: int
    message: str


class ConnectError(BaseModel):
    """A Connect RPC unary error (`code` is Connect's lower-case name)."""

    code: str
    message: str


def connect_error(exc: ServiceError) -> dict[str, str]:
    return {"code": CONNECT_CODES.get(exc.code, "internal"), "message": exc.message}


def rest_error(exc: ServiceError) -> JSONResponse:
    status = STATUS.get(exc.code, 500)
    return JSONResponse({"code": status, "message": exc.message}, status, headers=exc.headers)


def connect_unary_error(exc: ServiceError) -> JSONResponse:
    body = connect_error(exc)
    # A known procedure asked with another method: HTTP's 405, as connect-go answers it.
    status = 405 if exc.code is ErrorCode.METHOD_NOT_ALLOWED else CONNECT_STATUS[body["code"]]
    return JSONResponse(body, status, headers=exc.headers)
