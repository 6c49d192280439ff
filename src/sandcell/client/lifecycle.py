"""The sandbox lifecycle (SPEC §5), written once for `Sandbox` and `AsyncSandbox`."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from sandcell.client.binding import classoperation, constructor, operation
from sandcell.client.config import ClientConfig, RetryPolicy, retry_policy
from sandcell.client.errors import SandboxNotFoundError
from sandcell.client.models import SandboxInfo, SandboxMetrics, list_in
from sandcell.client.network import NetworkOperations
from sandcell.client.persistence import PersistenceOperations
from sandcell.client.protocol import Op, Request, call, call_json

if TYPE_CHECKING:
    from sandcell.client.commands import CommandsBase
    from sandcell.client.files import FilesBase
    from sandcell.client.pty import PtyBase

_SANDBOX_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def sandbox_path(sandbox_id: str, rest: str = "") -> str:
    if not isinstance(sandbox_id, str) or not _SANDBOX_ID.fullmatch(sandbox_id):
        raise SandboxNotFoundError(
            f"sandbox {sandbox_id!r} not found (not a valid sandbox id)",
            details={"sandbox_id": str(sandbox_id)},
        )
    return f"/v1/sandboxes/{quote(sandbox_id, safe='')}" + (f"/{rest}" if rest else "")


def _seconds(value: float | None) -> float | int | None:
    if value is None:
        return None
    return int(value) if float(value).is_integer() else value


class SandboxBase(NetworkOperations, PersistenceOperations):
    """State and operations shared by `Sandbox` and `AsyncSandbox`.

    Get one from `create` or `connect`; constructing it directly is for the library.
    """

    _commands_class: type[CommandsBase]
    _files_class: type[FilesBase]
    _pty_class: type[PtyBase]
    _transport: Any

    def __init__(self, info: SandboxInfo, transport: Any) -> None:
        self._info = info
        self._transport = transport
        self.commands = self._commands_class(self)
        self.files = self._files_class(self)
        self.pty = self._pty_class(self)

    @classmethod
    def _adopt(cls, result: Any, transport: Any) -> Any:
        return cls(result, transport)

    @property
    def id(self) -> str:
        return self._info.id

    @property
    def last_info(self) -> SandboxInfo:
        """What the server said last (no request); `info()` asks again."""
        return self._info

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.id} {self._info.template} {self._info.state}>"

    @constructor
    def create(
        cls,
        template: str = "default",
        timeout: float | None = None,
        lifetime: float | None = None,
        env: Mapping[str, str] | None = None,
        metadata: Mapping[str, str] | None = None,
        network: Mapping[str, Any] | None = None,
        snapshot: str | None = None,
        resources: Mapping[str, float] | None = None,
        auto_resume: bool = True,
        on_timeout: str = "delete",
        secrets: Sequence[str] = (),
        api_key: str | None = None,
        url: str | None = None,
        config: ClientConfig | None = None,
    ) -> Op[SandboxInfo]:
        """Create a sandbox from `template`, or on a copy of `snapshot`'s files.

        `timeout`: idle timeout in seconds (no request for this long and the sandbox is
        deleted; the template's default otherwise); `lifetime`: maximum lifetime in seconds;
        `env`: default environment of every command; `metadata`: your labels; `network`: the
        egress policy, e.g. `{"allow": ["pypi.org"]}` (the template's otherwise); `resources`:
        `{"cpus", "memory_mb", "disk_mb"}` within the template's max_*; `auto_resume`: a
        request to the paused sandbox resumes it (else `SandboxPausedError`); `on_timeout`:
        "pause" keeps the files when the idle timeout or lifetime ends; `secrets`: names of your
        secrets (`client.secrets`), each set in every command's environment to a placeholder
        that the egress proxy replaces with the value towards the secret's hosts (the value
        never enters the sandbox). `api_key` and `url`
        default to SANDCELL_API_KEY and SANDCELL_URL (http://127.0.0.1:8700).
        """
        body: dict[str, Any] = {"template": template}
        if snapshot is not None:
            body["snapshot"] = snapshot
        if resources:
            body["resources"] = dict(resources)
        if not auto_resume:
            body["auto_resume"] = False
        if on_timeout != "delete":
            body["on_timeout"] = on_timeout
        for name, value in (("idle_timeout_s", timeout), ("max_lifetime_s", lifetime)):
            if value is not None:
                body[name] = _seconds(value)
        if env:
            body["env"] = dict(env)
        if metadata:
            body["metadata"] = dict(metadata)
        if network is not None:
            body["network"] = dict(network)
        if secrets:
            if isinstance(secrets, str):  # a lone name would be sent letter by letter
                secrets = [secrets]
            body["secrets"] = list(secrets)
        # Not idempotent: a request that may have reached the server is never repeated.
        request = Request("POST", "/v1/sandboxes", json=body, idempotent=False)
        data = yield from call_json(request, retry_policy(url, api_key, config))
        return SandboxInfo.from_dict(data)

    @constructor
    def connect(
        cls,
        sandbox_id: str,
        api_key: str | None = None,
        url: str | None = None,
        config: ClientConfig | None = None,
    ) -> Op[SandboxInfo]:
        """Attach to an existing sandbox (SandboxNotFoundError if it is gone or not yours)."""
        request = Request("GET", sandbox_path(sandbox_id))
        data = yield from call_json(request, retry_policy(url, api_key, config))
        return SandboxInfo.from_dict(data)

    @classoperation
    def list(
        cls,
        api_key: str | None = None,
        url: str | None = None,
        config: ClientConfig | None = None,
    ) -> Op[list[SandboxInfo]]:
        """Your sandboxes (all of them for an admin key)."""
        request = Request("GET", "/v1/sandboxes")
        data = yield from call_json(request, retry_policy(url, api_key, config))
        return [SandboxInfo.from_dict(x) for x in list_in(data, "sandboxes")]

    @operation
    def info(self) -> Op[SandboxInfo]:
        """The sandbox as the server sees it now."""
        data = yield from call_json(Request("GET", sandbox_path(self.id)), self._policy)
        self._info = SandboxInfo.from_dict(data)
        return self._info

    @operation
    def keepalive(self, idle_timeout_s: float | None = None) -> Op[SandboxInfo]:
        """Reset the idle timer (optionally to a new idle timeout, in seconds)."""
        body = {} if idle_timeout_s is None else {"idle_timeout_s": _seconds(idle_timeout_s)}
        request = Request("POST", sandbox_path(self.id, "keepalive"), json=body)
        data = yield from call_json(request, self._policy)
        self._info = SandboxInfo.from_dict(data)
        return self._info

    @operation
    def kill(self) -> Op[bool]:
        """Delete the sandbox and everything in it; True if this call deleted it, False if
        there was nothing to delete (already gone, or never yours). Killing twice is fine."""
        try:
            yield from call(Request("DELETE", sandbox_path(self.id)), self._policy)
        except SandboxNotFoundError:
            return False
        return True

    @operation
    def get_metrics(self) -> Op[SandboxMetrics]:
        """CPU, memory, pids and disk use now, beside the template's limits."""
        data = yield from call_json(Request("GET", sandbox_path(self.id, "metrics")), self._policy)
        return SandboxMetrics.from_dict(data)

    @property
    def _policy(self) -> RetryPolicy:
        return self._transport.config.retry
