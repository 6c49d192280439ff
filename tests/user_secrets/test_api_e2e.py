"""The secrets API against a real `sandcell serve` (SPEC §17): each endpoint attacked (no
key, another principal, bad input, a huge value, a flood), and the value never seen again:
not in an answer, an error, the server's log or the store's file."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from sandcell.secrets.shapes import MAX_SECRETS_PER_PRINCIPAL, MAX_VALUE_BYTES
from support.server import RunningServer

pytestmark = pytest.mark.slow

VALUE = "sk-live-4f1c9a0e77d2-the-real-value-never-shown"


@pytest.fixture(scope="module")
def alice(server: RunningServer) -> Iterator[httpx.Client]:
    with server.client(server.create_key("alice")) as c:
        yield c


@pytest.fixture(scope="module")
def bob(server: RunningServer) -> Iterator[httpx.Client]:
    with server.client(server.create_key("bob")) as c:
        yield c


def _secret(name: str = "OPENAI_API_KEY", **kw: object) -> dict:
    return {"name": name, "value": VALUE, "hosts": ["api.openai.com"], **kw}


def _error(r: httpx.Response, status: int, code: str) -> dict:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["code"] == code
    assert VALUE not in r.text
    return error


def test_lifecycle_never_returns_the_value(alice: httpx.Client, server: RunningServer) -> None:
    r = alice.post("/v1/secrets", json=_secret("LIFE", **{"in": ["headers", "query"]}))
    assert r.status_code == 201, r.text
    made = r.json()
    assert made["name"] == "LIFE" and made["hosts"] == ["api.openai.com"]
    assert made["in"] == ["headers", "query"] and "value" not in made
    listed = alice.get("/v1/secrets").json()["secrets"]
    assert [s["name"] for s in listed if s["name"] == "LIFE"] == ["LIFE"]
    r = alice.put("/v1/secrets/LIFE", json={"value": VALUE + "-rotated"})
    assert r.status_code == 200 and r.json()["hosts"] == ["api.openai.com"], r.text
    db = server.data_dir / "sandcell.db"
    at_rest = b"".join(p.read_bytes() for p in (db, db.with_name(db.name + "-wal")) if p.exists())
    assert b"LIFE" in at_rest and VALUE.encode() not in at_rest  # sealed, on disk too
    assert r.json()["updated_at"] >= made["updated_at"]
    r = alice.put("/v1/secrets/LIFE", json={"hosts": ["API.Example.com.", "api.example.com:8443"]})
    assert r.json()["hosts"] == ["api.example.com", "api.example.com:8443"], r.text
    _error(alice.post("/v1/secrets", json=_secret("LIFE")), 409, "CONFLICT")
    assert alice.delete("/v1/secrets/LIFE").status_code == 204
    _error(alice.delete("/v1/secrets/LIFE"), 404, "NOT_FOUND")
    _error(alice.put("/v1/secrets/LIFE", json={"value": VALUE}), 404, "NOT_FOUND")
    for text in (r.text, alice.get("/v1/secrets").text, server.log.read_text()):
        assert VALUE not in text


def test_no_key_is_refused(server: RunningServer) -> None:
    with server.client() as anon, server.client("sc_not-a-key") as forged:
        for c in (anon, forged):
            _error(c.post("/v1/secrets", json=_secret()), 401, "UNAUTHENTICATED")
            _error(c.get("/v1/secrets"), 401, "UNAUTHENTICATED")
            _error(c.put("/v1/secrets/X", json={"value": VALUE}), 401, "UNAUTHENTICATED")
            _error(c.delete("/v1/secrets/X"), 401, "UNAUTHENTICATED")


def test_another_principal_gets_404(alice: httpx.Client, bob: httpx.Client) -> None:
    assert alice.post("/v1/secrets", json=_secret("ALICE_ONLY")).status_code == 201
    assert all(s["name"] != "ALICE_ONLY" for s in bob.get("/v1/secrets").json()["secrets"])
    _error(bob.put("/v1/secrets/ALICE_ONLY", json={"value": "x"}), 404, "NOT_FOUND")
    _error(bob.delete("/v1/secrets/ALICE_ONLY"), 404, "NOT_FOUND")
    r = bob.post("/v1/sandboxes", json={"secrets": ["ALICE_ONLY"]})
    assert _error(r, 404, "NOT_FOUND")["details"]["secret"] == "ALICE_ONLY"
    # Bob may have his own of the same name; Alice's stays hers.
    assert bob.post("/v1/secrets", json=_secret("ALICE_ONLY", value="bobs")).status_code == 201
    assert alice.delete("/v1/secrets/ALICE_ONLY").status_code == 204
    assert bob.delete("/v1/secrets/ALICE_ONLY").status_code == 204


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "lower", "value": VALUE, "hosts": ["a.example"]}, "name"),
        ({"name": "1ABC", "value": VALUE, "hosts": ["a.example"]}, "name"),
        ({"name": "A" * 65, "value": VALUE, "hosts": ["a.example"]}, "name"),
        ({"name": "A-B", "value": VALUE, "hosts": ["a.example"]}, "name"),
        ({"name": "A", "value": "", "hosts": ["a.example"]}, "value"),
        ({"name": "A", "value": 12, "hosts": ["a.example"]}, "value"),
        ({"name": "A", "value": "a\u0000b", "hosts": ["a.example"]}, "value"),
        ({"name": "A", "value": VALUE, "hosts": []}, "hosts"),
        ({"name": "A", "value": VALUE, "hosts": ["127.0.0.1"]}, "hosts"),
        ({"name": "A", "value": VALUE, "hosts": ["10.0.0.0/8"]}, "hosts"),
        ({"name": "A", "value": VALUE, "hosts": ["*.example.com"]}, "hosts"),
        ({"name": "A", "value": VALUE, "hosts": ["bad_host!.com"]}, "hosts"),
        ({"name": "A", "value": VALUE, "hosts": ["intranet"]}, "hosts"),
        ({"name": "A", "value": VALUE, "hosts": ["a.example:0"]}, "hosts"),
        ({"name": "A", "value": VALUE, "hosts": ["a.example"] * 33}, "hosts"),
        ({"name": "A", "value": VALUE, "hosts": ["a.example"], "in": ["body"]}, "in"),
        ({"name": "A", "value": VALUE, "hosts": ["a.example"], "in": ["cookies"]}, "in"),
        ({"name": "A", "value": VALUE, "hosts": ["a.example"], "in": []}, "in"),
        ({"name": "A", "value": VALUE, "hosts": ["a.example"], "extra": 1}, "extra"),
        ({"value": VALUE, "hosts": ["a.example"]}, "name"),
    ],
)
def test_bad_input_names_the_field(alice: httpx.Client, body: dict, field: str) -> None:
    error = _error(alice.post("/v1/secrets", json=body), 400, "BAD_REQUEST")
    assert field in {e["loc"][0] for e in error["details"]["errors"]}, error


def test_bad_rotation_names_the_field(alice: httpx.Client) -> None:
    assert alice.post("/v1/secrets", json=_secret("ROT")).status_code == 201
    for body, field in (
        ({"value": ""}, "value"),
        ({"value": None}, "value"),
        ({"hosts": ["::1"]}, "hosts"),
        ({"in": ["query"]}, "in"),
        ({"name": "OTHER"}, "name"),
    ):
        error = _error(alice.put("/v1/secrets/ROT", json=body), 400, "BAD_REQUEST")
        assert field in {e["loc"][0] for e in error["details"]["errors"]}, error
    _error(alice.put("/v1/secrets/ROT", json={}), 400, "BAD_REQUEST")  # nothing to change
    for junk in (b"", b"not json", b"[]", b'{"value": "x"' + b"]" * 10):
        r = alice.put("/v1/secrets/ROT", content=junk, headers={"content-type": "application/json"})
        _error(r, 400, "BAD_REQUEST")
    _error(alice.put("/v1/secrets/lower%20case", json={"value": "x"}), 404, "NOT_FOUND")
    assert alice.delete("/v1/secrets/ROT").status_code == 204


def test_huge_value_is_refused(alice: httpx.Client, server: RunningServer) -> None:
    big = "v" * (MAX_VALUE_BYTES + 1)
    error = _error(alice.post("/v1/secrets", json=_secret("BIG", value=big)), 400, "BAD_REQUEST")
    assert error["details"]["errors"][0]["loc"] == ["value"]
    assert big[:1000] not in server.log.read_text()
    at_limit = _secret("BIG", value="é" * (MAX_VALUE_BYTES // 2))  # bytes, not characters
    assert alice.post("/v1/secrets", json=at_limit).status_code == 201
    over = {"value": "é" * (MAX_VALUE_BYTES // 2) + "x"}
    _error(alice.put("/v1/secrets/BIG", json=over), 400, "BAD_REQUEST")
    r = alice.post("/v1/secrets", content=b'{"name": "X", "value": "' + b"a" * 2_000_000)
    _error(r, 413, "PAYLOAD_TOO_LARGE")
    assert alice.delete("/v1/secrets/BIG").status_code == 204


def test_flood_is_bounded(server: RunningServer) -> None:
    with server.client(server.create_key("flooder")) as c:
        for i in range(MAX_SECRETS_PER_PRINCIPAL):
            assert c.post("/v1/secrets", json=_secret(f"S{i}")).status_code == 201
        error = _error(c.post("/v1/secrets", json=_secret("ONE_MORE")), 403, "FORBIDDEN")
        assert error["details"]["limit"] == MAX_SECRETS_PER_PRINCIPAL
        assert len(c.get("/v1/secrets").json()["secrets"]) == MAX_SECRETS_PER_PRINCIPAL
        assert c.delete("/v1/secrets/S0").status_code == 204
        assert c.post("/v1/secrets", json=_secret("ONE_MORE")).status_code == 201


def test_unknown_secret_on_create_is_named(alice: httpx.Client) -> None:
    r = alice.post("/v1/sandboxes", json={"secrets": ["NOPE_NOT_HERE"]})
    error = _error(r, 404, "NOT_FOUND")
    assert error["details"]["secret"] == "NOPE_NOT_HERE" and "NOPE_NOT_HERE" in error["message"]
    r = alice.post("/v1/sandboxes", json={"secrets": ["bad name"]})
    _error(r, 400, "BAD_REQUEST")
    r = alice.post("/v1/sandboxes", json={"secrets": ["A", "A"]})
    _error(r, 400, "BAD_REQUEST")


def test_cap_refusal_names_secret_and_cap(alice: httpx.Client) -> None:
    assert alice.post("/v1/secrets", json=_secret("CAPPED")).status_code == 201
    r = alice.post("/v1/sandboxes", json={"template": "closed", "secrets": ["CAPPED"]})
    error = _error(r, 403, "FORBIDDEN")
    assert error["details"] == {"secret": "CAPPED", "network_max": "none"}
    assert "CAPPED" in error["message"] and "network_max" in error["message"]
    none = {"secrets": ["CAPPED"], "network": {"egress": "none"}}
    _error(alice.post("/v1/sandboxes", json=none), 400, "BAD_REQUEST")
    deny = {"secrets": ["CAPPED"], "network": {"egress": "open", "deny": ["*.openai.com"]}}
    assert (
        _error(alice.post("/v1/sandboxes", json=deny), 400, "BAD_REQUEST")["details"]["secret"]
        == "CAPPED"
    )
    env = {"secrets": ["CAPPED"], "env": {"CAPPED": "mine"}}
    assert (
        _error(alice.post("/v1/sandboxes", json=env), 400, "BAD_REQUEST")["details"]["field"]
        == "env"
    )
    assert alice.delete("/v1/secrets/CAPPED").status_code == 204


def test_openapi_lists_the_routes(server: RunningServer) -> None:
    paths = httpx.get(f"{server.url}/openapi.json").json()["paths"]
    assert set(paths["/v1/secrets"]) == {"get", "post"}
    assert set(paths["/v1/secrets/{name}"]) == {"put", "delete"}


def test_admin_lists_its_own_secrets_only(server: RunningServer, alice: httpx.Client) -> None:
    assert alice.post("/v1/secrets", json=_secret("ALICE_SEES")).status_code == 201
    with server.client(server.create_key("root", admin=True)) as admin:
        assert admin.get("/v1/secrets").json() == {"secrets": []}
        _error(admin.delete("/v1/secrets/ALICE_SEES"), 404, "NOT_FOUND")
    assert alice.delete("/v1/secrets/ALICE_SEES").status_code == 204


def test_a_none_default_becomes_an_allow_list(alice: httpx.Client) -> None:
    assert alice.post("/v1/secrets", json=_secret("OPENS")).status_code == 201
    r = alice.post("/v1/sandboxes", json={"secrets": ["OPENS"]})
    assert r.status_code == 201, r.text
    assert r.json()["network"] == {"egress": "allowlist", "allow": ["api.openai.com"], "deny": []}
    assert alice.delete(f"/v1/sandboxes/{r.json()['id']}").status_code == 204
    assert alice.delete("/v1/secrets/OPENS").status_code == 204


def test_localhost_is_the_one_dotless_name(alice: httpx.Client) -> None:
    r = alice.post("/v1/secrets", json=_secret("LOCAL", hosts=["LocalHost:8443"]))
    assert r.status_code == 201 and r.json()["hosts"] == ["localhost:8443"], r.text
    assert alice.delete("/v1/secrets/LOCAL").status_code == 204


def test_secret_uses_are_on_metrics(server: RunningServer) -> None:
    text = httpx.get(f"{server.url}/metrics").text
    assert "# TYPE sandcell_secret_uses_total counter" in text
