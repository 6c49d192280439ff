"""`AsyncSandbox`: the asyncio/trio client, the same API as `Sandbox` with `await`."""

from __future__ import annotations

from types import TracebackType

from sandcell.client.binding import AsyncBound
from sandcell.client.code import CodeInterpreter
from sandcell.client.commands import AsyncCommands
from sandcell.client.errors import SandcellError
from sandcell.client.files import AsyncFiles
from sandcell.client.lifecycle import SandboxBase
from sandcell.client.pty import AsyncPty


class AsyncSandbox(AsyncBound, CodeInterpreter, SandboxBase):
    """A sandbox on a sandcell server, used with `await`.

    ```python
    async with AsyncSandbox.create() as sbx:   # or: sbx = await AsyncSandbox.create()
        print((await sbx.commands.run("echo hi")).stdout)
    ```
    Output and progress callbacks may be plain functions or coroutine functions.
    """

    _commands_class = AsyncCommands
    _files_class = AsyncFiles
    _pty_class = AsyncPty
    commands: AsyncCommands
    files: AsyncFiles
    pty: AsyncPty

    async def close(self) -> None:
        """Release the HTTP connections (the sandbox keeps running)."""
        await self._transport.close()

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await self.kill()
        except SandcellError:
            if exc is None:  # a failure inside the block is the one worth seeing
                raise
        finally:
            await self.close()
