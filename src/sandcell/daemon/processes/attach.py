"""`GET /v1/processes/{pid}/ws`: an interactive WebSocket attach to a process (SPEC §9).

Binary frames in are stdin (or terminal input); binary frames out are output; text frames
carry JSON control (`resize` in, `exit` out). The upgrade GET carries a request token bound
to `htm=GET` and its path: without a valid one the route table (daemon/http/table.py) refuses
the upgrade with a 401 body before this runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import TYPE_CHECKING, Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from sandcell.daemon.processes.outputlog import Chunk, parse_offset
from sandcell.errors import ErrorCode, ServiceError
from sandcell.http.errors import error_response

if TYPE_CHECKING:
    from sandcell.daemon.processes.table import Process


async def attach(websocket: WebSocket) -> None:
    daemon = websocket.app.state.daemon
    try:
        process = daemon.processes.get(websocket.path_params["pid"])
        offset = parse_offset(websocket.query_params.get("offset", "0"))
    except ServiceError as exc:
        await websocket.send_denial_response(error_response(exc))
        return
    await websocket.accept()
    output = asyncio.ensure_future(_send_output(websocket, process, offset))
    incoming = asyncio.ensure_future(_receive_input(websocket, process))
    try:
        await asyncio.wait({output, incoming}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (output, incoming):
            task.cancel()
        with contextlib.suppress(Exception):
            await websocket.close()


async def _send_output(websocket: WebSocket, process: Process, offset: int) -> None:
    async for item in process.log.follow(offset, live=True):
        if isinstance(item, Chunk):
            await websocket.send_bytes(item.data)
        else:
            await websocket.send_text(json.dumps({"type": "lost", "bytes": item.bytes}))
    await websocket.send_text(json.dumps({"type": "exit", **(process.exit or {})}))


async def _receive_input(websocket: WebSocket, process: Process) -> None:
    with contextlib.suppress(WebSocketDisconnect):
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                return
            try:
                if message.get("bytes") is not None:
                    await process.write_stdin(message["bytes"])
                elif message.get("text") is not None:
                    _control(process, message["text"])
            except ServiceError as exc:
                await websocket.send_text(json.dumps({"type": "error", **exc.body()["error"]}))


def _control(process: Process, text: str) -> None:
    try:
        message: Any = json.loads(text)
    except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
        raise ServiceError(ErrorCode.BAD_REQUEST, "control frames are JSON") from None
    if not isinstance(message, dict) or message.get("type") != "resize":
        raise ServiceError(ErrorCode.BAD_REQUEST, 'the only control frame is {"type": "resize"}')
    cols, rows = message.get("cols"), message.get("rows")
    if not (isinstance(cols, int) and isinstance(rows, int)) or not (
        0 < cols <= 10_000 and 0 < rows <= 10_000
    ):
        raise ServiceError(ErrorCode.BAD_REQUEST, "resize needs cols and rows in 1..10000")
    process.resize(cols, rows)
