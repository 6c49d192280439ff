"""Egress policy and exposed ports (SPEC §11), written once for `Sandbox` and `AsyncSandbox`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sandcell.client.binding import operation
from sandcell.client.errors import InvalidResponseError
from sandcell.client.models import SandboxInfo
from sandcell.client.protocol import Op, Request, call_json

if TYPE_CHECKING:
    from sandcell.client.config import RetryPolicy


def network_policy(
    egress: str | None = None, allow: Sequence[str] = (), deny: Sequence[str] = ()
) -> dict[str, Any]:
    """A policy body; with only `allow` given, egress defaults to "allowlist"."""
    policy: dict[str, Any] = {"allow": list(allow), "deny": list(deny)}
    if egress is not None:
        policy["egress"] = egress
    return policy


class NetworkOperations:
    """What it needs of the sandbox it is mixed into (SandboxBase)."""

    _info: SandboxInfo

    if TYPE_CHECKING:

        @property
        def id(self) -> str: ...
        @property
        def _policy(self) -> RetryPolicy: ...

    @operation
    def set_network(self, policy: Mapping[str, Any]) -> Op[SandboxInfo]:
        """Replace the egress policy (`{"egress": ..., "allow": [...], "deny": [...]}`);
        new connections follow it at once. Wider than the template allows: `ForbiddenError`;
        a malformed entry: `BadRequestError` naming it."""
        request = Request("PATCH", _path(self.id, "network"), json=dict(policy))
        data = yield from call_json(request, self._policy)
        self._info = SandboxInfo.from_dict(data)
        return self._info

    @operation
    def get_url(self, port: int, expires_in_s: int = 3600) -> Op[str]:
        """A signed preview URL for what the sandbox serves on `port`: it needs no API key
        (open it in a browser), expires after `expires_in_s`, and dies with the sandbox."""
        body = {"expires_in_s": int(expires_in_s)}
        request = Request("POST", _path(self.id, f"ports/{int(port)}/url"), json=body)
        data = yield from call_json(request, self._policy)
        if not isinstance(data, dict) or not isinstance(data.get("url"), str):
            raise InvalidResponseError("unexpected reply, wanted a url")
        return data["url"]


def _path(sandbox_id: str, rest: str) -> str:
    from sandcell.client.lifecycle import sandbox_path  # lifecycle builds on this module

    return sandbox_path(sandbox_id, rest)
