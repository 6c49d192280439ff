"""One error shape for every response that is not 2xx (SPEC §1)."""

from __future__ import annotations

import logging

from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from sandcell.errors import ErrorCode, ServiceError, code_for_status, error_body
from sandcell.http.limits import TIMED_OUT
from sandcell.logs import printable

log = logging.getLogger("sandcell.http")
# Statuses recorded (metrics, access log) for requests whose client is gone: it left
# (nginx's 499), or the guard answered its too-slow body itself. Never sent by the app.
CLIENT_CLOSED = 499
BODY_TIMED_OUT = 408


def error_response(exc: ServiceError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


async def _sandcell_error(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, ServiceError)
    return error_response(exc)


async def _http_exception(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = code_for_status(exc.status_code)
    return JSONResponse(
        error_body(code, str(exc.detail)), status_code=exc.status_code, headers=exc.headers
    )


async def _client_disconnected(request: Request, _: Exception) -> Response:
    """The client left (or the guard cut its too-slow body): nothing to answer, no bug."""
    return Response(status_code=BODY_TIMED_OUT if TIMED_OUT in request.scope else CLIENT_CLOSED)


async def _unexpected(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s %s", request.method, printable(request.url.path))
    return JSONResponse(error_body(ErrorCode.INTERNAL, "internal error"), status_code=500)


EXCEPTION_HANDLERS = {
    ServiceError: _sandcell_error,
    HTTPException: _http_exception,
    ClientDisconnect: _client_disconnected,
    Exception: _unexpected,
}
