"""The console's session against a real server, from outside any browser (httpx and a
WebSocket client): what a forged, cross-origin or stale request gets (SPEC §19)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from support.server import RunningServer


def _signed_in(server: RunningServer, key: str) -> tuple[httpx.Client, str]:
    c = httpx.Client(base_url=server.url, timeout=30)
    r = c.post("/ui/session", data={"api_key": key}, headers={"origin": server.url})
    assert r.status_code == 200, r.text
    return c, r.json()["csrf_token"]


@pytest.fixture
def session(server: RunningServer, alice: str) -> Iterator[tuple[httpx.Client, str]]:
    c, csrf = _signed_in(server, alice)
    try:
        yield c, csrf
    finally:
        c.close()


def _refused(r: httpx.Response, status: int, words: str) -> None:
    assert r.status_code == status, r.text
    assert r.json()["error"]["code"] == {401: "UNAUTHENTICATED", 403: "FORBIDDEN"}[status]
    assert words in r.json()["error"]["message"]


def test_the_cookie_is_sealed_http_only_and_strict(server: RunningServer, alice: str) -> None:
    with httpx.Client(base_url=server.url) as c:
        r = c.post("/ui/session", data={"api_key": alice}, headers={"origin": server.url})
    cookie = r.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/" in cookie
    assert "Secure" not in cookie  # plain HTTP here; over TLS it is set
    assert alice not in cookie and alice.removeprefix("sc_") not in cookie


def test_over_tls_the_cookie_is_secure(server: RunningServer, alice: str) -> None:
    """Behind a TLS front on loopback (whose X-Forwarded-Proto the server trusts), the
    request came over TLS: the cookie is `Secure` and the server's own origin is https."""
    https = server.url.replace("http://", "https://")
    with httpx.Client(base_url=server.url, headers={"x-forwarded-proto": "https"}) as c:
        r = c.post("/ui/session", data={"api_key": alice}, headers={"origin": https})
        assert r.status_code == 200, r.text
        assert "Secure" in r.headers["set-cookie"]
        r = c.post("/ui/session", data={"api_key": alice}, headers={"origin": server.url})
        _refused(r, 403, f"must come from {https}")


def test_reads_need_no_token(session: tuple[httpx.Client, str]) -> None:
    c, _ = session
    assert c.get("/v1/sandboxes").status_code == 200
    assert c.get("/ui/session").json()["principal"] == "alice"


def test_a_change_without_the_token_or_from_elsewhere_is_refused(
    server: RunningServer, session: tuple[httpx.Client, str]
) -> None:
    c, csrf = session
    own = {"origin": server.url}
    _refused(c.post("/v1/sandboxes", json={}, headers=own), 403, "X-CSRF-Token")
    _refused(
        c.post("/v1/sandboxes", json={}, headers={**own, "x-csrf-token": csrf[:-1]}), 403, "CSRF"
    )
    elsewhere = {"origin": "http://evil.example", "x-csrf-token": csrf}
    _refused(c.post("/v1/sandboxes", json={}, headers=elsewhere), 403, "evil.example")
    _refused(c.post("/v1/sandboxes", json={}, headers={"x-csrf-token": csrf}), 403, "no Origin")
    _refused(c.delete("/ui/session", headers={"origin": server.url}), 403, "X-CSRF-Token")
    assert c.get("/v1/sandboxes").json() == {"sandboxes": []}  # nothing was made


def test_a_change_with_both_goes_through(
    server: RunningServer, session: tuple[httpx.Client, str]
) -> None:
    c, csrf = session
    good = {"origin": server.url, "x-csrf-token": csrf}
    made = c.post("/v1/sandboxes", json={}, headers=good)
    assert made.status_code == 201, made.text
    assert c.delete(f"/v1/sandboxes/{made.json()['id']}", headers=good).status_code == 204
    # SPEC §20: the console's actions are the API's, recorded under the signed-in key
    trail = c.get("/v1/audit", params={"sandbox": made.json()["id"]}).json()["records"]
    assert [(r["action"], r["principal"], r["key_name"]) for r in trail] == [
        ("sandbox.create", "alice", "alice"),
        ("sandbox.delete", "alice", "alice"),
    ]


def test_a_websocket_upgrade_needs_the_token_and_the_origin(
    server: RunningServer, session: tuple[httpx.Client, str], bob: str
) -> None:
    c, csrf = session
    good = {"origin": server.url, "x-csrf-token": csrf}
    sandbox_id = c.post("/v1/sandboxes", json={}, headers=good).json()["id"]
    try:
        base = f"/v1/sandboxes/{sandbox_id}/processes"
        pid = c.post(base, json={"command": "cat", "stdin": True}, headers=good).json()["pid"]
        url = server.url.replace("http", "ws", 1) + f"{base}/{pid}/ws"
        cookie = {"cookie": f"sandcell_session={c.cookies['sandcell_session']}"}
        attempts = {
            "no token": (server.url, ["sandcell.console"]),
            "a wrong token": (server.url, ["sandcell.console", "sandcell.csrf.x"]),
            "another origin": (
                "http://evil.example",
                ["sandcell.console", f"sandcell.csrf.{csrf}"],
            ),
        }
        for why, (origin, protocols) in attempts.items():
            with pytest.raises(InvalidStatus) as refused:
                connect(url, additional_headers=cookie, origin=origin, subprotocols=protocols)
            assert refused.value.response.status_code == 403, why
        protocols = ["sandcell.console", f"sandcell.csrf.{csrf}"]
        bobs, bobs_csrf = _signed_in(server, bob)
        with contextlib.closing(bobs), pytest.raises(InvalidStatus) as refused:
            connect(
                url,
                additional_headers={
                    "cookie": f"sandcell_session={bobs.cookies['sandcell_session']}"
                },
                origin=server.url,
                subprotocols=["sandcell.console", f"sandcell.csrf.{bobs_csrf}"],
            )
        assert refused.value.response.status_code == 404  # another's terminal: not revealed
        with connect(
            url, additional_headers=cookie, origin=server.url, subprotocols=protocols
        ) as ws:
            assert ws.subprotocol == "sandcell.console"
            ws.send(b"through\n")
            assert ws.recv(timeout=10) == b"through\n"
    finally:
        c.delete(f"/v1/sandboxes/{sandbox_id}", headers=good)


def test_an_admins_session_sees_every_principals_sandboxes(
    server: RunningServer, alice: str
) -> None:
    with server.client(alice) as api:
        alices = api.post("/v1/sandboxes", json={}).json()["id"]
    c, _ = _signed_in(server, server.create_key("root", admin=True))
    try:
        assert c.get("/ui/session").json()["admin"] is True
        assert alices in [x["id"] for x in c.get("/v1/sandboxes").json()["sandboxes"]]
    finally:
        c.close()
        with server.client(alice) as api:
            api.delete(f"/v1/sandboxes/{alices}")


def test_a_navigation_is_not_authenticated_by_the_cookie(
    session: tuple[httpx.Client, str],
) -> None:
    """A browser's navigation (or embed) to the API gets no session: a sandbox's own page,
    behind one of its ports, never runs at the console's origin as the user."""
    c, _ = session
    for mode in ("navigate", "no-cors"):
        _refused(c.get("/v1/sandboxes", headers={"sec-fetch-mode": mode}), 403, mode)
    assert c.get("/v1/sandboxes", headers={"sec-fetch-mode": "cors"}).status_code == 200


@pytest.mark.slow  # two runs of `sandcell keys`
def test_a_revoked_keys_session_stops_at_once(server: RunningServer) -> None:
    key = server.create_key("carol")
    c, _ = _signed_in(server, key)
    try:
        assert c.get("/v1/sandboxes").status_code == 200
        server.revoke_key("carol")
        _refused(c.get("/v1/sandboxes"), 401, "revoked")
        _refused(c.get("/ui/session"), 401, "revoked")
    finally:
        c.close()


def test_a_forged_or_stale_cookie_is_unauthenticated(
    server: RunningServer, session: tuple[httpx.Client, str]
) -> None:
    c, _ = session
    value = c.cookies["sandcell_session"]
    flipped = value[:20] + ("A" if value[20] != "A" else "B") + value[21:]
    for bad in (flipped, "", "not-a-session", value[:-8]):
        with httpx.Client(base_url=server.url, cookies={"sandcell_session": bad}) as other:
            _refused(other.get("/v1/sandboxes"), 401, "console session")


def test_sign_in_refuses_a_wrong_key_and_a_foreign_origin(
    server: RunningServer, alice: str
) -> None:
    with httpx.Client(base_url=server.url) as c:
        _refused(
            c.post("/ui/session", data={"api_key": "sc_nope"}, headers={"origin": server.url}),
            401,
            "API key",
        )
        _refused(
            c.post(
                "/ui/session", data={"api_key": alice}, headers={"origin": "http://evil.example"}
            ),
            403,
            "evil",
        )
        assert "sandcell_session" not in c.cookies


def test_sign_out_clears_the_cookie(
    server: RunningServer, session: tuple[httpx.Client, str]
) -> None:
    c, csrf = session
    r = c.delete("/ui/session", headers={"origin": server.url, "x-csrf-token": csrf})
    assert r.status_code == 204
    assert "sandcell_session" not in c.cookies
    assert c.get("/v1/sandboxes").status_code == 401


def test_a_bearer_key_needs_no_token(server: RunningServer, alice: str) -> None:
    """The cookie's rules are the cookie's: an API client is not asked for a CSRF token."""
    with server.client(alice) as api:
        made = api.post("/v1/sandboxes", json={})
        assert made.status_code == 201
        assert api.delete(f"/v1/sandboxes/{made.json()['id']}").status_code == 204
