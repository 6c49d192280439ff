"""`AsyncTransport`: the effects of operations performed with `httpx.AsyncClient`, anyio for
sleeping and for local file I/O off the event loop (see `transport` for the blocking one)."""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import AsyncIterator
from typing import Any, TypeVar

import anyio
import anyio.to_thread

from sandcell.client.config import ClientConfig
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
from sandcell.client.transport import (
    OpRun,
    Stream,
    build_request,
    client_options,
    connection_error,
)

T = TypeVar("T")


class AsyncTransport:
    def __init__(self, config: ClientConfig) -> None:
        self.config = config
        self._client = httpx.AsyncClient(**client_options(config), transport=config.async_transport)

    async def close(self) -> None:
        await self._client.aclose()

    async def run(self, op: Op[T]) -> T:
        run = OpRun(op)
        try:
            effect = run.advance()
            while not run.done:
                try:
                    value = await self._perform(effect, run)
                except BaseException as exc:  # into the operation: its cleanup runs
                    effect = run.advance(error=exc)
                else:
                    effect = run.advance(value)
            return run.result  # type: ignore[return-value]
        finally:
            op.close()
            with anyio.CancelScope(shield=True):
                for resource in run.resources:
                    await _aclose(resource)

    async def _perform(self, effect: Effect | None, run: OpRun[Any]) -> Any:
        if isinstance(effect, Send):
            return await self._send(effect.request, run)
        if isinstance(effect, Read):
            try:
                return await anext(effect.stream.chunks, b"")
            except httpx.HTTPError as exc:
                raise connection_error(exc, self.config) from exc
        if isinstance(effect, Close):
            return await effect.stream.response.aclose()
        if isinstance(effect, Sleep):
            return await anyio.sleep(effect.seconds)
        if isinstance(effect, Invoke):
            return await _maybe_await(effect.fn(*effect.args))
        if isinstance(effect, Blocking):
            return await anyio.to_thread.run_sync(functools.partial(effect.fn, *effect.args))
        if isinstance(effect, Spawn):
            # A task that outlives this call (asyncio): a handle's output follower.
            return asyncio.ensure_future(self.run(effect.op))
        if isinstance(effect, Join):
            return await asyncio.shield(effect.job)
        raise TypeError(f"unknown effect {effect!r}")

    async def _send(self, req: Request, run: OpRun[Any]) -> Reply:
        content: Any = req.content  # bytes, None, or an upload's chunks
        if isinstance(content, FileUpload):
            content = self._upload_body(content, run)
            run.resources.append(content)
        try:
            response = await self._client.send(
                build_request(self._client, req, content), stream=True
            )
        except httpx.HTTPError as exc:
            raise connection_error(exc, self.config) from exc
        run.resources.append(response)
        if req.stream:
            return Reply(
                response.status_code,
                response.headers,
                b"",
                Stream(response, response.aiter_bytes()),
            )
        try:
            body = await response.aread()
        except httpx.HTTPError as exc:
            raise connection_error(exc, self.config) from exc
        finally:
            await response.aclose()
        return Reply(response.status_code, response.headers, body)

    @staticmethod
    async def _upload_body(upload: FileUpload, run: OpRun[Any]) -> AsyncIterator[bytes]:
        reader = await anyio.to_thread.run_sync(upload.open)
        run.resources.append(reader)
        while chunk := await anyio.to_thread.run_sync(reader.read):
            yield chunk
            await _maybe_await(reader.advance(len(chunk)))


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


async def _aclose(resource: Any) -> None:
    for name in ("aclose", "close"):
        closer = getattr(resource, name, None)
        if closer is not None:
            await _maybe_await(closer())
            return
