"""`Sandbox`: the blocking client (`AsyncSandbox` has the same API, async)."""

from __future__ import annotations

from types import TracebackType

from sandcell.client.binding import SyncBound
from sandcell.client.code import CodeInterpreter
from sandcell.client.commands import Commands
from sandcell.client.errors import SandcellError
from sandcell.client.files import Files
from sandcell.client.lifecycle import SandboxBase
from sandcell.client.pty import Pty


class Sandbox(SyncBound, CodeInterpreter, SandboxBase):
    """A sandbox on a sandcell server, used with blocking calls.

    ```python
    with Sandbox.create() as sbx:          # SANDCELL_URL, SANDCELL_API_KEY
        print(sbx.commands.run("echo hi").stdout)
    ```
    The `with` block kills the sandbox on exit. `close()` only releases the connection.
    """

    _commands_class = Commands
    _files_class = Files
    _pty_class = Pty
    commands: Commands
    files: Files
    pty: Pty

    def close(self) -> None:
        """Release the HTTP connections (the sandbox keeps running)."""
        self._transport.close()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.kill()
        except SandcellError:
            if exc is None:  # a failure inside the block is the one worth seeing
                raise
        finally:
            self.close()
