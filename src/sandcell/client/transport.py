"""The I/O layer: two small interpreters of the effects that operations yield.

`SyncTransport` (here) performs them with `httpx.Client`; `AsyncTransport` (in
`async_transport`, so that blocking use never imports asyncio or anyio) with
`httpx.AsyncClient`. Everything else, from request building to retries, is shared in
`protocol` and the operation generators; what both transports need of httpx is here.
"""

from __future__ import annotations

import concurrent.futures
import functools
import ssl
import threading
import time
from collections.abc import Iterator
from typing import Any, Generic, TypeVar

from sandcell.client.config import ClientConfig
from sandcell.client.errors import ConnectionFailedError
from sandcell.client.lean_httpx import httpx
from sandcell.client.protocol import (
    Blocking,
    Close,
    Effect,
    FileUpload,
    Invoke,
    Join,
    Op,
    Read,
    Reply,
    Request,
    Send,
    Sleep,
    Spawn,
)

T = TypeVar("T")


def connection_error(exc: httpx.HTTPError, config: ClientConfig) -> ConnectionFailedError:
    """A transport failure, and whether the request may have reached the server."""
    not_sent = isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout)
    timed_out = isinstance(exc, httpx.TimeoutException)
    detail = str(exc) or type(exc).__name__
    if not_sent:
        message = f"cannot connect to {config.url}: {detail}"
    elif timed_out:
        message = f"{config.url} did not answer in time"
    else:
        message = f"the connection to {config.url} broke: {detail}"
    return ConnectionFailedError(message, request_sent=not not_sent, timed_out=timed_out)


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """httpx's default verification (its CA bundle), loaded once per process, not once per
    client (~50 ms each)."""
    return httpx.create_ssl_context()


def _plain_http_context() -> ssl.SSLContext:
    """For an http:// server: never used, so the CA bundle is not loaded. Were it used, it
    would verify against no CA at all and refuse every certificate (fails closed)."""
    return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)


def client_options(config: ClientConfig) -> dict[str, Any]:
    https = config.url.startswith("https://")
    return {
        "base_url": config.url,
        "headers": config.headers(),
        "timeout": httpx.Timeout(config.timeout, connect=config.connect_timeout),
        "follow_redirects": False,
        "verify": _tls_context() if https else _plain_http_context(),
    }


def build_request(
    client: httpx.Client | httpx.AsyncClient, req: Request, content: Any
) -> httpx.Request:
    timeout = (
        httpx.Timeout(req.timeout, connect=client.timeout.connect)
        if req.timeout is not None
        else httpx.USE_CLIENT_DEFAULT
    )
    return client.build_request(
        req.method,
        req.path,
        params=req.params,
        json=req.json,
        content=content,
        headers=req.headers,
        timeout=timeout,
    )


class Stream:
    """A streamed reply: the response and its body iterator."""

    def __init__(self, response: httpx.Response, chunks: Any) -> None:
        self.response = response
        self.chunks = chunks


class OpRun(Generic[T]):
    """Drives one operation: feeds results (or exceptions) in, takes the next effect out."""

    def __init__(self, op: Op[T]) -> None:
        self.op = op
        self.done = False
        self.result: T | None = None
        self.resources: list[Any] = []  # responses and upload readers to close at the end

    def advance(self, value: Any = None, error: BaseException | None = None) -> Effect | None:
        try:
            effect = self.op.throw(error) if error is not None else self.op.send(value)
        except StopIteration as stop:
            self.done, self.result = True, stop.value
            return None
        return effect


class SyncTransport:
    def __init__(self, config: ClientConfig) -> None:
        self.config = config
        self._client = httpx.Client(**client_options(config), transport=config.transport)

    def close(self) -> None:
        self._client.close()

    def run(self, op: Op[T]) -> T:
        run = OpRun(op)
        try:
            effect = run.advance()
            while not run.done:
                try:
                    value = self._perform(effect, run)
                except BaseException as exc:  # into the operation: its cleanup runs
                    effect = run.advance(error=exc)
                else:
                    effect = run.advance(value)
            return run.result  # type: ignore[return-value]
        finally:
            op.close()
            for resource in run.resources:
                resource.close()

    def _perform(self, effect: Effect | None, run: OpRun[Any]) -> Any:
        if isinstance(effect, Send):
            return self._send(effect.request, run)
        if isinstance(effect, Read):
            try:
                return next(effect.stream.chunks, b"")
            except httpx.HTTPError as exc:
                raise connection_error(exc, self.config) from exc
        if isinstance(effect, Close):
            return effect.stream.response.close()
        if isinstance(effect, Sleep):
            return time.sleep(effect.seconds)
        if isinstance(effect, Invoke | Blocking):
            return effect.fn(*effect.args)
        if isinstance(effect, Spawn):
            return self._spawn(effect.op)
        if isinstance(effect, Join):
            return effect.job.result()
        raise TypeError(f"unknown effect {effect!r}")

    def _spawn(self, op: Op[Any]) -> concurrent.futures.Future[Any]:
        """A daemon thread: a follower must not keep the interpreter from exiting."""
        job: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def work() -> None:
            try:
                job.set_result(self.run(op))
            except BaseException as exc:
                job.set_exception(exc)

        threading.Thread(target=work, name="sandcell-follow", daemon=True).start()
        return job

    def _send(self, req: Request, run: OpRun[Any]) -> Reply:
        content: Any = req.content  # bytes, None, or an upload's chunks
        if isinstance(content, FileUpload):
            content = self._upload_body(content, run)
        try:
            response = self._client.send(build_request(self._client, req, content), stream=True)
        except httpx.HTTPError as exc:
            raise connection_error(exc, self.config) from exc
        run.resources.append(response)
        if req.stream:
            return Reply(
                response.status_code,
                response.headers,
                b"",
                Stream(response, iter(response.iter_bytes())),
            )
        try:
            body = response.read()
        except httpx.HTTPError as exc:
            raise connection_error(exc, self.config) from exc
        finally:
            response.close()
        return Reply(response.status_code, response.headers, body)

    @staticmethod
    def _upload_body(upload: FileUpload, run: OpRun[Any]) -> Iterator[bytes]:
        reader = upload.open()
        run.resources.append(reader)
        while chunk := reader.read():
            yield chunk
            reader.advance(len(chunk))
