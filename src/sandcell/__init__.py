"""sandcell: disposable, isolated Linux sandboxes for untrusted code.

The SDK (`Sandbox`, `AsyncSandbox`, the exceptions, ...) is imported lazily from
`sandcell.client` on first use, so `import sandcell` stays cheap (the in-cell daemon imports
this package too, and must not pull in an HTTP client).
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing is not imported at run time: it is not cheap
__version__ = "0.1.0"

__all__ = [
    "AlreadyInitializedError",
    "AsyncSandbox",
    "AuthenticationError",
    "BadRequestError",
    "ClientConfig",
    "CommandExitError",
    "CommandHandle",
    "CommandResult",
    "ConfigurationError",
    "ConflictError",
    "ConnectionFailedError",
    "EntryInfo",
    "Execution",
    "ExecutionError",
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
    "ProcessInfo",
    "RateLimitedError",
    "Result",
    "RetryPolicy",
    "Sandbox",
    "SandboxInfo",
    "SandboxMetrics",
    "SandboxNotFoundError",
    "SandboxPausedError",
    "SandboxTimeoutError",
    "SandboxUnreachableError",
    "SandcellError",
    "ServiceUnavailableError",
    "SnapshotInfo",
    "__version__",
]
_CLIENT_EXPORTS = frozenset(__all__) - {"__version__"}

if TYPE_CHECKING:
    from sandcell.client import (
        AlreadyInitializedError,
        AsyncSandbox,
        AuthenticationError,
        BadRequestError,
        ClientConfig,
        CommandExitError,
        CommandHandle,
        CommandResult,
        ConfigurationError,
        ConflictError,
        ConnectionFailedError,
        EntryInfo,
        Execution,
        ExecutionError,
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
        ProcessInfo,
        RateLimitedError,
        Result,
        RetryPolicy,
        Sandbox,
        SandboxInfo,
        SandboxMetrics,
        SandboxNotFoundError,
        SandboxPausedError,
        SandboxTimeoutError,
        SandboxUnreachableError,
        SandcellError,
        ServiceUnavailableError,
        SnapshotInfo,
    )


def __getattr__(name: str) -> object:
    if name in _CLIENT_EXPORTS:
        from sandcell import client

        value = getattr(client, name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module 'sandcell' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_CLIENT_EXPORTS})
