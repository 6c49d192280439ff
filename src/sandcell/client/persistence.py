"""Pause, resume, snapshots and fork (SPEC §13), written once for `Sandbox` and `AsyncSandbox`.

Pause and snapshots keep files only: running processes and interpreter memory are not kept.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from sandcell.client.binding import classoperation, constructor, operation
from sandcell.client.config import ClientConfig, retry_policy
from sandcell.client.models import SandboxInfo, SnapshotInfo
from sandcell.client.protocol import Op, Request, call_deleted, call_json

if TYPE_CHECKING:
    from sandcell.client.config import RetryPolicy


class _ClassOrInstance:
    """`Sandbox.resume(id)` on the class (a new object), `sbx.resume()` on an instance."""

    def __init__(self, on_class: constructor[...], on_instance: operation[..., Any]) -> None:
        self.on_class, self.on_instance = on_class, on_instance
        self.__doc__ = on_instance.__doc__

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        if obj is None:
            return self.on_class.__get__(None, owner)
        return self.on_instance.__get__(obj, owner)


def _resume_by_id(
    cls: Any,
    sandbox_id: str,
    api_key: str | None = None,
    url: str | None = None,
    config: ClientConfig | None = None,
) -> Op[SandboxInfo]:
    """Resume a paused sandbox by id (a running one is returned as it is)."""
    request = Request("POST", _path(sandbox_id, "resume"))
    data = yield from call_json(request, retry_policy(url, api_key, config))
    return SandboxInfo.from_dict(data)


def _resume(self: Any) -> Op[SandboxInfo]:
    """Resume this sandbox: a new cell on its kept workspace (files, env and metadata are
    the same; processes started before the pause are not running)."""
    data = yield from call_json(Request("POST", _path(self.id, "resume")), self._policy)
    self._info = SandboxInfo.from_dict(data)
    return self._info


class PersistenceOperations:
    """What it needs of the sandbox it is mixed into (SandboxBase)."""

    _info: SandboxInfo

    if TYPE_CHECKING:

        @property
        def id(self) -> str: ...
        @property
        def _policy(self) -> RetryPolicy: ...

    _transport: Any

    @operation
    def pause(self) -> Op[SandboxInfo]:
        """Pause: every process ends and the cell is released, the files are kept (memory is
        not). A later request resumes it if it was created with auto_resume (the default)."""
        data = yield from call_json(Request("POST", _path(self.id, "pause")), self._policy)
        self._info = SandboxInfo.from_dict(data)
        return self._info

    resume = _ClassOrInstance(constructor(_resume_by_id), operation(_resume))

    @operation
    def snapshot(self, name: str | None = None) -> Op[SnapshotInfo]:
        """A consistent copy of the workspace (the sandbox's processes are frozen while it
        is taken); start sandboxes from it with `create(snapshot=...)`."""
        request = Request("POST", _path(self.id, "snapshots"), json={"name": name})
        data = yield from call_json(request, self._policy)
        return SnapshotInfo.from_dict(data)

    @constructor
    def fork_of(
        cls,
        sandbox_id: str,
        api_key: str | None = None,
        url: str | None = None,
        config: ClientConfig | None = None,
    ) -> Op[SandboxInfo]:
        """A new sandbox on a copy of `sandbox_id`'s workspace, with its settings."""
        request = Request("POST", _path(sandbox_id, "fork"), idempotent=False)
        data = yield from call_json(request, retry_policy(url, api_key, config))
        return SandboxInfo.from_dict(data)

    def fork(self) -> Any:
        """`fork_of(self.id)`: a new sandbox (awaitable on `AsyncSandbox`) on a copy of this
        one's files; this one runs on untouched."""
        cls: Any = type(self)  # Sandbox or AsyncSandbox, each with its fork_of
        return cls.fork_of(self.id, config=self._transport.config)

    @classoperation
    def list_snapshots(
        cls,
        api_key: str | None = None,
        url: str | None = None,
        config: ClientConfig | None = None,
    ) -> Op[list[SnapshotInfo]]:
        """Your snapshots (all of them for an admin key)."""
        request = Request("GET", "/v1/snapshots")
        data = yield from call_json(request, retry_policy(url, api_key, config))
        items = data.get("snapshots") if isinstance(data, dict) else None
        return [SnapshotInfo.from_dict(x) for x in items or []]

    @classoperation
    def delete_snapshot(
        cls,
        snapshot_id: str,
        api_key: str | None = None,
        url: str | None = None,
        config: ClientConfig | None = None,
    ) -> Op[bool]:
        """True if this call deleted it, False if there was none (or it is not yours)."""
        request = Request("DELETE", f"/v1/snapshots/{quote(snapshot_id, safe='')}")
        return (yield from call_deleted(request, retry_policy(url, api_key, config)))


def _path(sandbox_id: str, rest: str) -> str:
    from sandcell.client.lifecycle import sandbox_path  # lifecycle builds on this module

    return sandbox_path(sandbox_id, rest)
