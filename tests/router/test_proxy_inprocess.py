"""the core's `Hop` against a real daemon app served in-process (uvicorn on a unix socket in
the test's own event loop).

Signing, body binding, path confinement, connection reuse and error mapping of the proxy run
without a cell; the end-to-end tests cover the same path through real processes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from sandcell import tokens
from sandcell.cellapi.client import dialer
from sandcell.http.upstream import Dial
from sandcell.router.core import Hop
from support.proxying import (
    in_process_daemon,
    proxy_client,
    sandbox_record,
    served,
    start_unconfined_spawner,
    stored,
)

SANDBOX_ID = "sbx-inproc"


@pytest.fixture(scope="module", autouse=True)
def _spawner() -> None:
    start_unconfined_spawner()


def _daemon(workspace: Path, bootstrap: tokens.PrivateKey) -> Starlette:
    return in_process_daemon(SANDBOX_ID, workspace, bootstrap)


@pytest.fixture
async def front(tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, list[str]]]:
    """A client of a one-route app that forwards to the daemon through a the core's `Hop`;
    the list collects each endpoint the proxy asked to dial and each connection it opened."""
    (tmp_path / "ws").mkdir()
    bootstrap, session = tokens.generate_p256(), tokens.generate_p256()
    daemon = _daemon(tmp_path / "ws", bootstrap)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(daemon), base_url="http://d"
    ) as direct:
        token = tokens.mint_bootstrap_token(bootstrap, SANDBOX_ID, tokens.public_pem(session))
        assert (await direct.post("/init", json={"token": token})).status_code == 200

    asked: list[str] = []
    uds = tmp_path / "daemon.sock"

    def dialer_for(endpoint: dict[str, Any]) -> tuple[Dial, bytes]:
        asked.append(endpoint["uds"])
        dial, host = dialer({"uds": str(uds)})

        async def counted(factory: Any) -> Any:
            asked.append("connection")
            return await dial(factory)

        return counted, host

    record = sandbox_record(SANDBOX_ID, {"uds": "x"})
    async with served(daemon, uds), stored(tmp_path, record, session) as store:
        proxy = Hop(store, dialer_for=dialer_for)
        async with proxy_client(proxy, record) as client:
            yield client, asked
        await proxy.close()


@pytest.mark.anyio
async def test_requests_reach_the_daemon_signed_and_body_bound(front: Any) -> None:
    client, asked = front
    base = f"/v1/sandboxes/{SANDBOX_ID}"
    reply = await client.post(f"{base}/exec", json={"command": "echo $((6*7))"})
    assert reply.status_code == 200 and reply.json()["stdout"] == "42\n"
    assert (await client.put(f"{base}/files?path=a.txt", content=b"abc")).status_code == 200
    assert (await client.get(f"{base}/files?path=a.txt")).content == b"abc"
    assert asked == ["x", "connection"]  # one pool per daemon endpoint, one kept connection


@pytest.mark.anyio
async def test_only_the_daemons_v1_is_reachable(front: Any) -> None:
    client, _ = front
    # Encoded so that the HTTP client sends them as they are; the server decodes them.
    for path in (
        f"/v1/sandboxes/{SANDBOX_ID}/%2E%2E/%2E%2E/init",
        f"/v1/sandboxes/{SANDBOX_ID}%2F..%2Finit/exec",
    ):
        reply = await client.post(path, json={})
        assert reply.status_code == 400, path
        assert reply.json()["error"]["code"] == "BAD_REQUEST"


@pytest.mark.anyio
async def test_unreachable_daemon_maps_to_502(tmp_path: Path) -> None:
    record = sandbox_record(SANDBOX_ID, {"uds": str(tmp_path / "nobody.sock")})
    async with stored(tmp_path, record, tokens.generate_p256()) as store:
        proxy = Hop(store)
        async with proxy_client(proxy, record) as client:
            reply = await client.post(f"/v1/sandboxes/{SANDBOX_ID}/exec", json={"command": "true"})
        await proxy.close()
    assert reply.status_code == 502
    assert reply.json()["error"]["code"] == "SANDBOX_UNREACHABLE"
