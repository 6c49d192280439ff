"""The façade is a table: every E2B operation is in /openapi.json, names the header that
authenticates it, and refuses a call without that credential in E2B's own 401 shape (so a
route added to the table cannot forget authentication); what the table does not serve is
answered in E2B's shapes too."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator

import httpx
import pytest
from e2b import Sandbox

from sandcell.compat import e2b
from support.server import RunningServer

pytestmark = pytest.mark.slow

CONTROL_SCHEMES = [{"e2bApiKey": []}]
ENVD_SCHEMES = [{"e2bSandboxId": [], "e2bAccessToken": []}]
# Failed authentications are throttled per client address (router/auth.py): each refused
# call comes from an address of its own on the loopback network.
_ADDRESSES = (f"127.0.{i // 250}.{i % 250 + 2}" for i in itertools.count())


@pytest.fixture(scope="module")
def document(e2b_server: RunningServer) -> dict:
    return httpx.get(f"{e2b_server.url}/openapi.json", timeout=10).json()


def _e2b_operations(document: dict) -> Iterator[tuple[str, str, dict]]:
    for path, ops in document["paths"].items():
        if path.startswith("/e2b/"):
            for method, op in ops.items():
                yield method.upper(), path, op


def _stranger(server: RunningServer) -> httpx.Client:
    transport = httpx.HTTPTransport(local_address=next(_ADDRESSES))
    return httpx.Client(base_url=server.url, transport=transport, timeout=30)


def _concrete(path: str) -> str:
    return re.sub(r"{\w+}", "sbx-0000", path)


def test_the_document_lists_every_operation_of_the_table(document: dict) -> None:
    listed = {(method, path) for method, path, _ in _e2b_operations(document)}
    assert listed == {(op.method, op.path) for op in e2b.OPERATIONS}
    for name in ("/e2b/sandboxes", "/e2b/v2/sandboxes", "/e2b/process.Process/Start"):
        assert name in document["paths"]
    schemes = document["components"]["securitySchemes"]
    assert schemes["bearer"]["scheme"] == "bearer"
    assert schemes["e2bApiKey"] == {**schemes["e2bApiKey"], "in": "header", "name": "X-API-KEY"}
    assert schemes["e2bAccessToken"]["name"] == "X-Access-Token"
    assert schemes["e2bSandboxId"]["name"] == "E2b-Sandbox-Id"
    for method, path, op in _e2b_operations(document):
        control = path.startswith(
            ("/e2b/sandboxes", "/e2b/v2/", "/e2b/snapshots", "/e2b/templates", "/e2b/secrets")
        )
        assert op["security"] == (CONTROL_SCHEMES if control else ENVD_SCHEMES), (method, path)
        assert "401" in op["responses"], (method, path)
    # The router's own operations keep their Bearer key.
    assert document["paths"]["/v1/sandboxes"]["post"]["security"] == [{"bearer": []}]


def _assert_refused(answer: httpx.Response, connect: bool, label: str) -> None:
    assert answer.status_code == 401, f"{label}: {answer.status_code} {answer.text[:200]}"
    body = answer.json()
    assert set(body) == {"code", "message"}, label
    assert body["code"] == ("unauthenticated" if connect else 401), label
    assert isinstance(body["message"], str) and body["message"], label


def test_every_operation_refuses_a_call_without_its_credential(
    e2b_server: RunningServer, document: dict, sbx: Sandbox
) -> None:
    """No key, an unknown key, no token, and the sandbox's id with another's token."""
    other_token = "A" * 22 + "." + "B" * 43
    for method, path, op in _e2b_operations(document):
        control = op["security"] == CONTROL_SCHEMES
        connect = "/process." in path or "/filesystem." in path
        url = _concrete(path)
        if control:
            attempts = [{}, {"X-API-KEY": "not-a-key"}, {"X-API-KEY": "e2b_00ff"}]
        else:
            attempts = [
                {"E2b-Sandbox-Id": sbx.sandbox_id},
                {"E2b-Sandbox-Id": sbx.sandbox_id, "X-Access-Token": other_token},
                {"E2b-Sandbox-Id": "sbx-0000", "X-Access-Token": sbx._envd_access_token or ""},
                # No id: the token names the sandbox, but under a forged MAC.
                {"X-Access-Token": f"{sbx.sandbox_id}.{other_token}"},
            ]
            # Neither an id nor a token naming one: a missing sandbox id, said as such.
            for headers in ({}, {"X-Access-Token": other_token}):
                with _stranger(e2b_server) as client:
                    answer = client.request(method, url, headers=headers, content=b"{}")
                label = f"{method} {path} {sorted(headers)}"
                assert answer.status_code == 400, f"{label}: {answer.status_code}"
                body = answer.json()
                assert body["code"] == ("invalid_argument" if connect else 400), label
                assert "missing sandbox id" in body["message"], label
        for headers in attempts:
            with _stranger(e2b_server) as client:
                answer = client.request(method, url, headers=headers, content=b"{}")
            _assert_refused(answer, connect, f"{method} {path} {sorted(headers)}")


def test_what_the_table_does_not_serve_answers_in_e2bs_shapes(
    e2b_server: RunningServer, e2b_env: dict[str, str]
) -> None:
    key = {"X-API-KEY": e2b_env["E2B_API_KEY"]}
    with httpx.Client(base_url=f"{e2b_server.url}/e2b", timeout=30) as client:
        answer = client.get("/sandboxes/a/b/c", headers=key)
        assert answer.status_code == 404
        assert answer.json() == {"code": 404, "message": "GET /sandboxes/a/b/c is not served"}
        answer = client.put("/sandboxes", headers=key)
        assert answer.status_code == 405
        assert answer.json()["code"] == 405
        assert set(answer.headers["allow"].split(", ")) >= {"GET", "POST"}
        answer = client.get("/process.Process/Start")
        assert answer.status_code == 405
        assert answer.json()["code"] == "unimplemented"
        answer = client.post("/process.Process/Nope", json={})
        assert answer.json()["code"] == "unimplemented"
        for path in ("/nothing/here", "", "/"):
            answer = client.get(path)
            assert answer.status_code == 404, path
            assert answer.json()["code"] == 404, path
