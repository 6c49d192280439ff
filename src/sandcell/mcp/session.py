"""Which sandbox a tool call works in: the one it names, or its MCP session's own.

The session sandbox is created on the session's first call that needs one and killed when
the session's connection closes (an HTTP client's DELETE or idle timeout, a stdio client's
end of input, which is also what a crashed client leaves behind). Whatever is still alive
when the server stops is killed then: the server's lifetime bounds every session sandbox.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator

import anyio
from mcp.server.connection import Connection

from sandcell.client import AsyncSandbox, ClientConfig, SandboxNotFoundError, SandcellError

log = logging.getLogger("sandcell.mcp")
STATE_KEY = "sandcell.session_sandbox"
LOCK_KEY = "sandcell.session_sandbox_lock"
USED_KEY = "sandcell.session_sandbox_used"
RECHECK_AFTER_S = 5.0
SESSION_LABEL = {"created_by": "sandcell-mcp", "role": "session"}


class NoSessionError(Exception):
    """A single-exchange HTTP request has no session to hold a sandbox across calls."""


class SessionSandboxes:
    """Session sandboxes of every connection of this server, killed at their session's end."""

    def __init__(self, config: ClientConfig, template: str) -> None:
        self.config = config
        self.template = template
        self._live: dict[str, AsyncSandbox] = {}

    async def for_connection(self, connection: Connection) -> AsyncSandbox:
        if not connection.has_standalone_channel:
            raise NoSessionError(
                "this request has no MCP session, so there is no session sandbox: call "
                "create_sandbox and pass its sandbox_id"
            )
        # One creation at a time per session: two first calls share one sandbox.
        async with connection.state.setdefault(LOCK_KEY, anyio.Lock()):
            sbx = connection.state.get(STATE_KEY)
            if sbx is not None and not await self._alive(connection, sbx):
                await self.release(sbx.id)
                sbx = None
            if sbx is None:
                sbx = await self._create(connection)
            connection.state[USED_KEY] = time.monotonic()
            return sbx

    async def _create(self, connection: Connection) -> AsyncSandbox:
        sbx = await AsyncSandbox.create(
            template=self.template, metadata=SESSION_LABEL, config=self.config
        )
        self._live[sbx.id] = sbx
        connection.state[STATE_KEY] = sbx
        connection.exit_stack.push_async_callback(self.release, sbx.id)
        log.info("session sandbox %s created", sbx.id)
        return sbx

    async def _alive(self, connection: Connection, sbx: AsyncSandbox) -> bool:
        """False when the sandbox is gone. A session that paused longer than the template's
        idle timeout (the user reading, the model thinking) finds its sandbox expired: it then
        gets a fresh one rather than an error on every call. Checked only after a pause."""
        if time.monotonic() - connection.state.get(USED_KEY, 0.0) < RECHECK_AFTER_S:
            return True
        try:
            await sbx.info()
        except SandboxNotFoundError:
            log.info("session sandbox %s expired; replacing it", sbx.id)
            return False
        return True

    async def release(self, sandbox_id: str) -> None:
        """Kill one session sandbox (a no-op when it is already gone)."""
        sbx = self._live.pop(sandbox_id, None)
        if sbx is None:
            return
        try:
            await sbx.kill()
            log.info("session sandbox %s deleted", sandbox_id)
        except SandcellError as exc:  # the server may be gone: its reaper then does it
            log.warning("session sandbox %s not deleted: %s", sandbox_id, exc)
        finally:
            await sbx.close()

    async def release_all(self) -> None:
        for sandbox_id in list(self._live):
            await self.release(sandbox_id)


@contextlib.asynccontextmanager
async def session_sandboxes(config: ClientConfig, template: str) -> AsyncIterator[SessionSandboxes]:
    """The server's lifespan: kills the session sandboxes left when it stops, however."""
    sessions = SessionSandboxes(config, template)
    try:
        yield sessions
    finally:
        with anyio.CancelScope(shield=True):
            await sessions.release_all()
