"""A router's client for a node's control calls (SPEC §18): `create` and `delete` over the
node API's mutual TLS, with the node's refusals raised again as the spec's errors they are.

A node that cannot be reached raises SANDBOX_UNREACHABLE naming it (`details.node`): for a
create the router places elsewhere; for a delete the sandbox stays the node's to reconcile.
"""

from __future__ import annotations

import ssl
from typing import Any

import httpx

from sandcell.errors import ErrorCode, ServiceError

CONTROL_TIMEOUT_S = 120.0  # a cold create (image, cell, init) is the longest control call


class NodeClient:
    def __init__(self, address: str, context: ssl.SSLContext) -> None:
        self.address = address
        self._http = httpx.AsyncClient(
            base_url=f"https://{address}", verify=context, timeout=CONTROL_TIMEOUT_S
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def create(self, owner: str, **fields: Any) -> dict[str, Any]:
        """The node's new sandbox record; `fields` as the node's create takes them."""
        answer = await self._call("POST", "/v1/cells", {"owner": owner, **fields})
        return answer.json()

    async def delete(self, sandbox_id: str) -> None:
        await self._call("DELETE", f"/v1/cells/{sandbox_id}")

    async def _call(self, method: str, path: str, body: Any = None) -> httpx.Response:
        try:
            answer = await self._http.request(method, path, json=body)
        except httpx.HTTPError as exc:
            raise ServiceError(
                ErrorCode.SANDBOX_UNREACHABLE,
                f"node {self.address} is unreachable",
                {"node": self.address},
            ) from exc
        if answer.is_success:
            return answer
        raise _error_of(self.address, answer)


def _error_of(address: str, answer: httpx.Response) -> ServiceError:
    """The node's refusal as it said it; an answer not in the spec's shape as unreachable."""
    try:
        error = answer.json()["error"]
        return ServiceError(ErrorCode(error["code"]), str(error["message"]), error.get("details"))
    except (ValueError, KeyError, TypeError):
        return ServiceError(
            ErrorCode.SANDBOX_UNREACHABLE,
            f"node {address} answered {answer.status_code}",
            {"node": address},
        )
