"""The sandcell Python SDK: `Sandbox` (blocking) and `AsyncSandbox` (async), same API.

```python
from sandcell import Sandbox

with Sandbox.create(template="default") as sbx:      # SANDCELL_URL, SANDCELL_API_KEY
    r = sbx.commands.run("echo hi", timeout=10)
    sbx.files.write("data/a.txt", b"hello")
```
"""

# The imports under TYPE_CHECKING are for type checkers; `__all__` is built from _EXPORTS.
# ruff: noqa: F401
from __future__ import annotations

import importlib

TYPE_CHECKING = False  # typing is not imported at run time: `Sandbox` users need not pay it

if TYPE_CHECKING:
    from sandcell.client.async_sandbox import AsyncSandbox
    from sandcell.client.code import Context, Execution, ExecutionError, Logs, OutputMessage, Result
    from sandcell.client.commands import AsyncCommands, Commands
    from sandcell.client.config import DEFAULT_URL, ClientConfig, RetryPolicy
    from sandcell.client.errors import (
        AlreadyInitializedError,
        AuthenticationError,
        BadRequestError,
        CommandExitError,
        ConfigurationError,
        ConflictError,
        ConnectionFailedError,
        FileNotFoundInSandboxError,
        ForbiddenError,
        InternalError,
        InvalidResponseError,
        IsolationUnavailableError,
        MethodNotAllowedError,
        NotFoundError,
        NotInitializedError,
        NotSupportedError,
        OverloadedError,
        PayloadTooLargeError,
        RateLimitedError,
        SandboxNotFoundError,
        SandboxPausedError,
        SandboxTimeoutError,
        SandboxUnreachableError,
        SandcellError,
        ServiceUnavailableError,
    )
    from sandcell.client.files import AsyncFiles, Files
    from sandcell.client.models import (
        CommandResult,
        EntryInfo,
        ProcessInfo,
        SandboxInfo,
        SandboxMetrics,
        SnapshotInfo,
    )
    from sandcell.client.processes import AsyncCommandHandle, CommandHandle
    from sandcell.client.pty import AsyncPty, AsyncPtyHandle, Pty, PtyHandle
    from sandcell.client.sandbox import Sandbox
    from sandcell.client.secrets import AsyncSecrets, Secrets

# The public names by the module that defines them: each is imported on first use (PEP 562),
# so `from sandcell.client import Sandbox` loads neither the async half nor asyncio.
_EXPORTS: dict[str, tuple[str, ...]] = {
    "async_sandbox": ("AsyncSandbox",),
    "code": ("Context", "Execution", "ExecutionError", "Logs", "OutputMessage", "Result"),
    "commands": ("AsyncCommands", "Commands"),
    "config": ("ClientConfig", "DEFAULT_URL", "RetryPolicy"),
    "errors": (
        "AlreadyInitializedError",
        "AuthenticationError",
        "BadRequestError",
        "CommandExitError",
        "ConfigurationError",
        "ConflictError",
        "ConnectionFailedError",
        "FileNotFoundInSandboxError",
        "ForbiddenError",
        "InternalError",
        "InvalidResponseError",
        "IsolationUnavailableError",
        "MethodNotAllowedError",
        "NotFoundError",
        "NotInitializedError",
        "NotSupportedError",
        "OverloadedError",
        "PayloadTooLargeError",
        "RateLimitedError",
        "SandboxNotFoundError",
        "SandboxPausedError",
        "SandboxTimeoutError",
        "SandboxUnreachableError",
        "SandcellError",
        "ServiceUnavailableError",
    ),
    "files": ("AsyncFiles", "Files"),
    "models": (
        "CommandResult",
        "EntryInfo",
        "ProcessInfo",
        "SandboxInfo",
        "SandboxMetrics",
        "SnapshotInfo",
    ),
    "processes": ("AsyncCommandHandle", "CommandHandle"),
    "pty": ("AsyncPty", "AsyncPtyHandle", "Pty", "PtyHandle"),
    "sandbox": ("Sandbox",),
    "secrets": ("AsyncSecrets", "Secrets"),
}
_HOMES = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_HOMES)


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'sandcell.client' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"sandcell.client.{home}"), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})
