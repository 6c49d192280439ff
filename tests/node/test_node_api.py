"""The node API of a real `sandcell node` (SPEC §18): only the cluster's routers get in, the
relay takes a router to one of the node's own cells and nothing else, and what goes through
it is checked by the daemon as always."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import ssl
from pathlib import Path

import pytest

from sandcell import tokens
from sandcell.cellapi.client import dialer
from sandcell.errors import ServiceError
from sandcell.http.upstream import UpstreamError
from sandcell.node import dial
from sandcell.node.client import NodeClient
from sandcell.router.core import Call, Hop
from sandcell.serve import opened_store
from sandcell.settings import load_settings
from support.server import free_port

from .conftest import Cluster, RunningNode, exchange, make_cluster

REQUEST = b"GET /v1/node HTTP/1.1\r\nhost: node\r\n\r\n"


def _client(ca: Path, cert: Path | None = None) -> ssl.SSLContext:
    """A TLS 1.3 client that trusts `ca` (so the node's side is what refuses) and presents
    `cert` (a member directory's), or nothing."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.load_verify_locations(cafile=ca)
    if cert is not None:
        context.load_cert_chain(cert / "cert.pem", cert / "key.pem")
    return context


def _refused(context: ssl.SSLContext, node: RunningNode) -> None:
    """The handshake fails: a request the node answers to any router gets no byte of an
    answer (the client sees an alert, a reset or, with TLS 1.3's late client check, the
    connection closed), while the same request from a router is answered."""
    try:
        got = exchange(context, node.port, REQUEST)
    except (ssl.SSLError, ConnectionResetError, BrokenPipeError):
        return
    assert got == b"", got


def test_a_router_of_the_cluster_is_answered(node: RunningNode) -> None:
    got = exchange(node.router_context(), node.port, REQUEST)
    assert got.startswith(b"HTTP/1.1 200 "), got
    assert json.loads(got.partition(b"\r\n\r\n")[2]) == {"node": "node-a"}


def test_a_client_without_a_certificate_is_refused(node: RunningNode) -> None:
    _refused(_client(node.cluster.root / "ca.pem"), node)


def test_a_node_certificate_presented_by_a_client_is_refused(node: RunningNode) -> None:
    other_node = node.cluster.member("node", "node-b")
    _refused(_client(node.cluster.root / "ca.pem", other_node), node)


def test_a_router_of_another_cluster_is_refused(
    node: RunningNode, tmp_path_factory: pytest.TempPathFactory
) -> None:
    theirs: Cluster = make_cluster(tmp_path_factory.mktemp("theirs") / "ca")
    their_router = theirs.member("router", "router-1")
    _refused(_client(node.cluster.root / "ca.pem", their_router), node)


def _answer(got: bytes) -> tuple[int, dict]:
    head, _, body = got.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), json.loads(body)


@pytest.mark.parametrize(
    ("request_bytes", "status", "code"),
    [
        (b"CONNECT /cells/sbx-0000000000000000 HTTP/1.1\r\n\r\n", 404, "SANDBOX_NOT_FOUND"),
        (b"CONNECT /elsewhere:443 HTTP/1.1\r\n\r\n", 400, "BAD_REQUEST"),
        (b"CONNECT /cells/../x HTTP/1.1\r\n\r\n", 400, "BAD_REQUEST"),
        (b"HELLO\r\n\r\n", 400, "BAD_REQUEST"),
        (b"GET /v1/node HTTP/1.1\r\nx: " + b"a" * 20_000 + b"\r\n\r\n", 400, "BAD_REQUEST"),
        (b"GET /v1/node HTTP/1.0\r\n\r\n", 400, "BAD_REQUEST"),
        (b"GET /v1/node HTTP/1.1\r\nno colon here\r\n\r\n", 400, "BAD_REQUEST"),
        (b"GET /v1/node HTTP/1.1\r\nx: 1\r\nX: 2\r\n\r\n", 400, "BAD_REQUEST"),
        (b"POST /v1/cells HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n", 400, "BAD_REQUEST"),
        (b"POST /v1/cells HTTP/1.1\r\ncontent-length: 99999999\r\n\r\n", 413, "PAYLOAD_TOO_LARGE"),
        (b"POST /v1/cells HTTP/1.1\r\ncontent-length: 3\r\n\r\n{x}", 400, "BAD_REQUEST"),
        (b"POST /v1/node HTTP/1.1\r\n\r\n", 405, "METHOD_NOT_ALLOWED"),
        (b"GET /v1/sandboxes HTTP/1.1\r\n\r\n", 404, "NOT_FOUND"),
        (b"DELETE /v1/cells/sbx-0000000000000000 HTTP/1.1\r\n\r\n", 404, "SANDBOX_NOT_FOUND"),
    ],
)
def test_a_request_the_node_does_not_take_is_refused_in_the_spec_shape(
    node: RunningNode, request_bytes: bytes, status: int, code: str
) -> None:
    got = exchange(node.router_context(), node.port, request_bytes)
    assert _answer(got)[0] == status, got
    assert _answer(got)[1]["error"]["code"] == code


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"owner": "key-1", "cpus": 2}, "cpus"),  # not taken here: refused, never dropped
        ({"owner": 7}, "owner"),
        ({"owner": "key-1", "env": {"A": 1}}, "env"),
        ({"owner": "key-1", "idle_timeout_s": True}, "idle_timeout_s"),
        ({}, "owner"),
    ],
)
def test_a_create_with_a_field_the_node_cannot_take_is_refused_by_name(
    node: RunningNode, body: dict, field: str
) -> None:
    with node.control() as client:
        answer = client.post("/v1/cells", json=body)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["details"]["field"] == field


def _connect(sandbox_id: str) -> bytes:
    return f"CONNECT /cells/{sandbox_id} HTTP/1.1\r\nhost: node\r\n\r\n".encode()


def _exec(authorization: bytes | None) -> bytes:
    body = b'{"command": "echo hi"}'
    head = b"POST /v1/exec HTTP/1.1\r\nhost: sandcell-daemon\r\nconnection: close\r\n"
    if authorization is not None:
        head += b"authorization: " + authorization + b"\r\n"
    return head + b"content-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body) + body


@pytest.mark.slow
def test_the_relay_reaches_the_cell_and_the_daemon_checks_each_token(node: RunningNode) -> None:
    record = node.create()
    assert "uds" in record["endpoint"]  # the node's own record; routers dial the node

    async def through_the_relay() -> list[bytes]:
        dial.configure(node.cluster.member("router", "router-1"))
        settings = load_settings(node.config, node.data_dir)
        async with opened_store(settings) as store:
            stored = await store.get_sandbox(record["id"])
            assert stored is not None
            on_node = {"node": node.address, "sandbox": record["id"]}
            hop = Hop(store)
            try:
                bodies = []
                for _ in range(2):  # the second over the pooled tunnel
                    call = Call.json("POST", "/v1/exec", {"command": "echo hi"})
                    answer = await hop.exchange(dataclasses.replace(stored, endpoint=on_node), call)
                    assert answer.status == 200
                    bodies.append(await answer.read())
                    answer.release()
                # A large answer comes through byte for byte, as on the cell's own socket.
                many = {"command": "seq 1 300000"}
                large = []
                for endpoint in (on_node, stored.endpoint):
                    record_at = dataclasses.replace(stored, endpoint=endpoint)
                    answer = await hop.exchange(record_at, Call.json("POST", "/v1/exec", many))
                    large.append(await answer.read())
                    answer.release()
                assert len(large[0]) > 1_000_000
                assert json.loads(large[0])["stdout"] == json.loads(large[1])["stdout"]
                # A sandbox the node does not run: the relay refuses, and says so.
                dial_other, _ = dialer({"node": node.address, "sandbox": "sbx-0000000000000000"})
                with pytest.raises(UpstreamError, match=r"404 Not Found: sandbox sbx-0+ is not"):
                    await dial_other(asyncio.Protocol)
                return bodies
            finally:
                await hop.close()
                dial.configure(None)

    for body in asyncio.run(through_the_relay()):
        assert json.loads(body)["stdout"] == "hi\n"

    # Without a token, or with one the sandbox's key did not sign, the daemon refuses.
    forged = tokens.mint_request_token(
        tokens.generate_p256(), record["id"], "POST", "/v1/exec", b'{"command": "echo hi"}'
    )
    for authorization in (None, b"Bearer not-a-token", b"Bearer " + forged.encode()):
        got = exchange(
            node.router_context(), node.port, _connect(record["id"]) + _exec(authorization)
        )
        opened, _, answer = got.partition(b"\r\n\r\n")
        assert opened.startswith(b"HTTP/1.1 200 "), got
        status, error = _answer(answer)
        assert status == 401, answer
        assert error["error"]["code"] == "UNAUTHENTICATED"

    with node.control() as client:
        assert client.delete(f"/v1/cells/{record['id']}").status_code == 204
        gone = client.delete(f"/v1/cells/{record['id']}")
    assert gone.status_code == 404
    node.created.remove(record["id"])
    got = exchange(node.router_context(), node.port, _connect(record["id"]))
    assert _answer(got)[1]["error"]["code"] == "SANDBOX_NOT_FOUND"


def test_the_router_client_raises_the_node_refusals_as_the_spec_errors(node: RunningNode) -> None:
    async def calls() -> list[ServiceError]:
        client = NodeClient(node.address, node.router_context())
        down = NodeClient(f"127.0.0.1:{free_port()}", node.router_context())
        caught = []
        try:
            for call in (
                client.create("key-1", cpus=2),
                client.delete("sbx-0000000000000000"),
                down.create("key-1"),
            ):
                with pytest.raises(ServiceError) as raised:
                    await call
                caught.append(raised.value)
        finally:
            await client.aclose()
            await down.aclose()
        return caught

    unknown_field, not_here, unreachable = asyncio.run(calls())
    assert (unknown_field.code, unknown_field.details["field"]) == ("BAD_REQUEST", "cpus")
    assert not_here.code == "SANDBOX_NOT_FOUND"
    assert unreachable.code == "SANDBOX_UNREACHABLE"
    assert unreachable.details["node"].startswith("127.0.0.1:")


@pytest.mark.slow
def test_the_router_client_creates_and_deletes_on_the_node(node: RunningNode) -> None:
    async def create_and_delete() -> dict:
        client = NodeClient(node.address, node.router_context())
        try:
            record = await client.create("key-2", metadata={"purpose": "test"})
            node.created.append(record["id"])
            await client.delete(record["id"])
            node.created.remove(record["id"])
            with pytest.raises(ServiceError):
                await client.delete(record["id"])
            return record
        finally:
            await client.aclose()

    record = asyncio.run(create_and_delete())
    assert (record["owner"], record["state"], record["metadata"]) == (
        "key-2",
        "running",
        {"purpose": "test"},
    )
