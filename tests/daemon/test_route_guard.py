"""Every route of the daemon app but three answers 401 without a valid token (SPEC §2.1).

The routes are enumerated from the app itself, not from a list kept here, so a route added
later, to the table or beside it, is called too: one that forgot the guard fails this test.
"""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
from starlette.routing import Route, WebSocketRoute
from websockets.exceptions import InvalidStatus
from websockets.sync.client import unix_connect

from sandcell import tokens
from sandcell.daemon.config import load
from sandcell.daemon.http.app import create_app
from support.daemons import RunningDaemon

PUBLIC = {("GET", "/health"), ("HEAD", "/health"), ("POST", "/init"), ("GET", "/openapi.json"),
          ("HEAD", "/openapi.json")}  # fmt: skip
# A value for each path parameter: the guard must answer before anything looks them up.
PARAMS = {"pid": "1", "port": "1", "path": "x", "context_id": "c"}
_PARAM = re.compile(r"{(\w+)(?::\w+)?}")
QUERY = "?path=victim&recursive=true"


def _concrete(template: str) -> str:
    return _PARAM.sub(lambda m: PARAMS[m.group(1)], template)


def _app_routes(tmp_path: Path) -> tuple[list[tuple[str, str]], list[str]]:
    """(method, path) of every HTTP route and the path of every WebSocket route."""
    pem = tokens.public_pem(tokens.generate_p256()).decode()
    env = {"SANDCELL_BOOTSTRAP_PUBLIC_KEY": pem, "SANDCELL_WORKSPACE": str(tmp_path)}
    app = create_app(load(["--uds", str(tmp_path / "s"), "--sandbox-id", "sbx-x"], env), env)
    http, websockets = [], []
    for route in app.routes:
        if isinstance(route, Route):
            http += [(m, _concrete(route.path)) for m in sorted(route.methods or ())]
        elif isinstance(route, WebSocketRoute):
            websockets.append(_concrete(route.path))
        else:
            raise AssertionError(f"a route this test does not know how to call: {route!r}")
    return http, websockets


def _forged(daemon: RunningDaemon, method: str, path: str, body: bytes | None) -> dict[str, str]:
    """Tokens that verify everywhere but here: for another path, method, sandbox or key."""
    key, sbx = daemon.session_key, daemon.sandbox_id
    return {
        "none": "",
        "garbage": "Bearer not.a.jwt",
        "other path": tokens.mint_request_token(key, sbx, method, "/v1/elsewhere", body),
        "other method": tokens.mint_request_token(
            key, sbx, "PATCH" if method != "PATCH" else "PUT", path, body
        ),
        "other sandbox": tokens.mint_request_token(key, "sbx-another", method, path, body),
        "other key": tokens.mint_request_token(tokens.generate_p256(), sbx, method, path, body),
    }


def _header(token: str) -> dict[str, str]:
    if not token or token.startswith("Bearer "):
        return {"authorization": token} if token else {}
    return {"authorization": f"Bearer {token}"}


def _code(response: httpx.Response) -> str | None:
    if response.request.method == "HEAD":  # no body to read: the status says it
        return "UNAUTHENTICATED"
    try:
        return response.json()["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None


def test_every_secured_route_refuses_a_missing_or_foreign_token(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    http, websockets = _app_routes(tmp_path)
    secured = [(m, p) for m, p in http if (m, p) not in PUBLIC]
    assert len(secured) >= 30 and len(websockets) == 2  # the table was really enumerated
    victim = daemon.workspace / "victim"
    victim.write_text("still here")
    body = b'{"command": "touch hacked", "path": "hacked", "from": "victim", "to": "moved"}'
    answers = {}
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(daemon.uds))) as c:
        for method, path in secured:
            target = path + QUERY
            for forgery, token in _forged(daemon, method, target, body).items():
                r = c.request(method, f"http://d{target}", content=body, headers=_header(token))
                answers[f"{method} {path} ({forgery})"] = (r.status_code, _code(r))
    assert {k: v for k, v in answers.items() if v != (401, "UNAUTHENTICATED")} == {}
    for path in websockets:
        for forgery, token in _forged(daemon, "GET", path, b"").items():
            with pytest.raises(InvalidStatus) as refused:
                unix_connect(
                    str(daemon.uds),
                    uri=f"ws://sandcell-daemon{path}",
                    additional_headers=_header(token),
                    open_timeout=5,
                ).close()
            assert refused.value.response.status_code == 401, (path, forgery)
    assert victim.read_text() == "still here"
    assert not (daemon.workspace / "hacked").exists()
    assert not (daemon.workspace / "moved").exists()


def test_the_public_routes_are_only_those_three(tmp_path: Path) -> None:
    """Adding a public route is a decision: this list changes with it."""
    http, _ = _app_routes(tmp_path)
    from sandcell.daemon.http.app import OPERATIONS

    public = {(op.method, op.path) for op in OPERATIONS if not op.secured}
    assert public == {("GET", "/health"), ("POST", "/init"), ("GET", "/openapi.json")}
    assert set(http) >= PUBLIC
