"""Who may use an agentcube session, and bad input: attacks on the façade, over raw HTTP."""

from __future__ import annotations

import pytest

from support.server import RunningServer

pytestmark = pytest.mark.slow
INVOKE = "/agentcube/v1/namespaces/team-a/code-interpreters/default/invocations"
ECHO = {"command": ["echo", "pwned"], "timeout": "5s"}


@pytest.fixture(scope="module")
def victim(server: RunningServer, api_key: str):
    """A session of the module's key (the victim), and another principal's key."""
    with server.client(api_key) as http:
        body = {"name": "default", "namespace": "team-a", "ttl": 600}
        created = http.post("/agentcube/v1/code-interpreter", json=body).raise_for_status()
    session_id = created.json()["sessionId"]
    yield session_id, server.create_key("agentcube-other")
    with server.client(api_key) as http:
        http.delete(f"/agentcube/v1/code-interpreter/sessions/{session_id}")


def _execute(server: RunningServer, session_id: str, key: str | None = None):
    with server.client(key) as http:
        return http.post(
            f"{INVOKE}/api/execute", json=ECHO, headers={"x-agentcube-session-id": session_id}
        )


def test_the_session_id_alone_runs_code(server: RunningServer, victim):
    session_id, _ = victim
    answer = _execute(server, session_id)
    assert answer.status_code == 200 and answer.json()["stdout"] == "pwned\n"
    assert answer.headers["x-agentcube-session-id"] == session_id


def test_another_principals_key_cannot_use_or_end_the_session(server: RunningServer, victim):
    session_id, other_key = victim
    refused = _execute(server, session_id, other_key)
    assert refused.status_code == 404
    assert refused.json()["error"]["code"] == "SANDBOX_NOT_FOUND"
    with server.client(other_key) as http:
        gone = http.delete(f"/agentcube/v1/code-interpreter/sessions/{session_id}")
    assert gone.status_code == 404
    assert _execute(server, session_id).status_code == 200  # still the victim's, still alive


def test_a_forged_session_id_is_refused(server: RunningServer, victim):
    session_id, _ = victim
    sandbox_id, mac = session_id.split(".")
    for forged in (sandbox_id, f"{sandbox_id}.{'A' * 43}", f"{sandbox_id}.{mac[::-1]}", "x"):
        assert _execute(server, forged).status_code == 404, forged


def test_the_session_id_alone_cannot_end_it(server: RunningServer, victim):
    session_id, _ = victim
    with server.client() as http:
        refused = http.delete(f"/agentcube/v1/code-interpreter/sessions/{session_id}")
    assert refused.status_code == 401


def test_a_session_of_another_name_or_namespace_is_not_found(server: RunningServer, victim):
    session_id, _ = victim
    with server.client() as http:
        for path in (
            "/v1/namespaces/team-b/code-interpreters/default/invocations/api/execute",
            "/v1/namespaces/team-a/code-interpreters/other/invocations/api/execute",
        ):
            answer = http.post(path, json=ECHO, headers={"x-agentcube-session-id": session_id})
            assert answer.status_code == 404, path


def test_an_empty_session_header_opens_a_session_with_a_key(server: RunningServer, api_key: str):
    with server.client() as http:
        assert http.get(f"{INVOKE}/health").status_code == 401
    with server.client(api_key) as http:
        opened = http.get(f"{INVOKE}/health", headers={"x-agentcube-session-id": ""})
        assert opened.status_code == 200
        session_id = opened.headers["x-agentcube-session-id"]
        ended = http.delete(f"/agentcube/v1/code-interpreter/sessions/{session_id}")
        assert ended.status_code == 204


@pytest.mark.parametrize(
    ("method", "path", "kwargs"),
    [
        ("POST", "api/execute", {"json": {"command": ["true"], "timeout": "soon"}}),
        ("POST", "api/execute", {"json": {"command": ["true"], "timeout": "-1s"}}),
        ("POST", "api/execute", {"json": {"command": []}}),
        ("POST", "api/execute", {"content": b"{not json"}),
        ("POST", "api/files", {"json": {"path": "a.txt", "content": "%%%"}}),
        ("POST", "api/files", {"files": {"file": ("a", b"x")}}),  # no path field
        ("GET", "api/files", {}),  # no path parameter
        ("GET", "api/files/", {}),
    ],
)
def test_bad_input_is_a_400(server: RunningServer, victim, method, path, kwargs):
    session_id, _ = victim
    with server.client() as http:
        answer = http.request(
            method, f"{INVOKE}/{path}", headers={"x-agentcube-session-id": session_id}, **kwargs
        )
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["code"] == "BAD_REQUEST"


def test_unknown_picod_route_is_a_404(server: RunningServer, victim):
    session_id, _ = victim
    with server.client() as http:
        answer = http.get(f"{INVOKE}/api/nope", headers={"x-agentcube-session-id": session_id})
    assert answer.status_code == 404 and answer.json()["error"]["code"] == "NOT_FOUND"


def test_a_revoked_keys_session_ids_stop_working(server: RunningServer):
    """A session id is its key's credential: revoking the key ends what the id opens."""
    key = server.create_key("agentcube-revoked")
    with server.client(key) as http:
        body = {"name": "default", "namespace": "team-a"}
        session_id = http.post("/agentcube/v1/code-interpreter", json=body).json()["sessionId"]
    assert _execute(server, session_id).status_code == 200
    server.revoke_key("agentcube-revoked")
    refused = _execute(server, session_id)
    assert refused.status_code == 404, refused.text
    assert refused.json()["error"]["code"] == "SANDBOX_NOT_FOUND"
