"""Error shape everywhere, no 500 for malformed input, body limits, and the OpenAPI document."""

from __future__ import annotations

import pytest

from sandcell.daemon.http.app import OPERATIONS


def _assert_error(response, status: int, code: str | None = None) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"code", "message", "details"}
    assert error["code"].isupper()
    if code:
        assert error["code"] == code


def test_unknown_route_and_method(client):
    _assert_error(client.http.get("/nope"), 404, "NOT_FOUND")
    _assert_error(client.http.delete("/health"), 405, "METHOD_NOT_ALLOWED")


@pytest.mark.parametrize(
    "raw",
    [b"{", b"[]", b"null", b'"s"', b"\xff\xfe", b'{"command": "\xff"}', b"", b"{}" * 10],
)
def test_malformed_json_is_400(client, raw):
    r = client.signed_request(
        "POST", "/v1/exec", content=raw, headers={"content-type": "application/json"}
    )
    _assert_error(r, 400, "BAD_REQUEST")


def test_json_body_limit(client):
    r = client.signed_request("POST", "/v1/exec", content=b" " * (9 * 1024 * 1024))
    _assert_error(r, 413, "PAYLOAD_TOO_LARGE")


def test_openapi_matches_routes(client, daemon):
    doc = client.http.get("/openapi.json").json()
    assert doc["openapi"].startswith("3.")
    documented = {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}
    # Starlette's {path:path} is OpenAPI's {path}.
    assert documented == {(op.method, op.path.replace(":path}", "}")) for op in OPERATIONS}
    exec_schema = doc["paths"]["/v1/exec"]["post"]["requestBody"]["content"]
    ref = exec_schema["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
    assert set(doc["components"]["schemas"][ref]["properties"]) == {
        "command",
        "cwd",
        "env",
        "timeout_s",
        "stdin",
        "max_output_bytes",
    }
    # Every documented route answers (no 404/405 from the router itself).
    for method, path in documented:
        r = client.http.request(method, path)
        assert r.status_code not in (404, 405) or r.json()["error"]["code"] == "FILE_NOT_FOUND"


def test_health_shape(client):
    h = client.http.get("/health").json()
    assert h["status"] == "ok" and h["initialized"] is True
    assert isinstance(h["version"], str) and h["uptime_s"] >= 0
