"""Property-based fuzzing of the router's and the daemon's HTTP APIs from their own OpenAPI
documents (schemathesis generates; we sign, send and judge).

Four targets, each in schemathesis' positive (schema-valid) and negative (schema-violating)
modes: the router's own API; the daemon's /v1 API reached through the router, into a real cell;
a bare daemon's whole API with correctly signed request tokens (every operation but exec,
which runs only inside the cell); and the E2B façade's operations under /e2b (in the router's
document), with a real key, sandbox and access token. Every case must answer within its
timeout, never with a 5xx, every error in the SPEC's shape (E2B's shapes under /e2b), every
success as the document says.

SANDCELL_FUZZ_EXAMPLES sets the examples per operation and mode (default 25),
SANDCELL_FUZZ_FACADE_EXAMPLES those of the façade's operations (default 12);
SANDCELL_FUZZ_RANDOM=1 draws new cases instead of the same ones on every run.
"""

from __future__ import annotations

import copy
import json
import os
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from reliability.harness import assert_error_shape, config, servers
from sandcell import tokens
from support.daemons import RunningDaemon, launch_daemon
from support.server import RunningServer

EXAMPLES = int(os.environ.get("SANDCELL_FUZZ_EXAMPLES", "25"))
FACADE_EXAMPLES = int(os.environ.get("SANDCELL_FUZZ_FACADE_EXAMPLES", "12"))
DERANDOMIZE = os.environ.get("SANDCELL_FUZZ_RANDOM") != "1"
CASE_TIMEOUT_S = 30
MODES = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
PROXIED = ("/health", "/init", "/openapi.json")  # the daemon's paths the router never proxies
# Random commands and processes run only inside a cell; so do port relays (on the host, a
# bare daemon's 127.0.0.1 is the host's: its services are no fuzzing target).
NOT_ON_THE_HOST = {("POST", "/v1/exec"), ("POST", "/v1/processes")} | {
    (method, "/v1/ports/{port}/{path}") for method in ("GET", "POST", "PUT", "DELETE", "PATCH")
}
# SPEC §11: nothing listening on an exposed port is a 502, by contract.
PORT_PATHS = ("/v1/ports/", "/p/", "/_preview-host/", "/v1/sandboxes/{sandbox_id}/ports/")
E2B = "/e2b/"
E2B_CONNECT = ("/e2b/process.", "/e2b/filesystem.")
E2B_CONTROL = ("/e2b/sandboxes", "/e2b/v2/sandboxes", "/e2b/secrets")
E2B_INTERPRETER = ("/e2b/execute", "/e2b/contexts")
E2B_ROOT = ("/files",)  # E2B's signed file URLs, served at the root (compat/e2b/signed.py)


# -- the OpenAPI documents -----------------------------------------------------------------------


def router_document(raw: dict) -> dict:
    """The router's document with its path parameters declared (see the xfail below)."""
    doc = copy.deepcopy(raw)
    paths = {}
    for path, ops in doc["paths"].items():
        path = path.replace("{rest:path}", "{rest}")
        for op in ops.values():
            names = [p.strip("{}") for p in path.split("/") if p.startswith("{")]
            op["parameters"] = [
                *op.get("parameters", []),
                *(
                    {"name": n, "in": "path", "required": True, "schema": {"type": "string"}}
                    for n in names
                ),
            ]
        paths[path] = ops
    doc["paths"] = paths
    return doc


def undeclared_path_parameters(doc: dict) -> list[str]:
    missing = []
    for path, ops in doc["paths"].items():
        names = [p.strip("{}") for p in path.split("/") if p.startswith("{")]
        for method, op in ops.items():
            declared = {p["name"] for p in op.get("parameters", []) if p.get("in") == "path"}
            missing += [f"{method.upper()} {path}: {n}" for n in names if n not in declared]
    return missing


# -- fixtures ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with servers(tmp_path_factory.mktemp("fuzz")) as fleet:
        yield fleet.start("data", config_text=config(max_sandboxes_per_key=3))


@pytest.fixture(scope="module")
def raw_router_document(server: RunningServer) -> dict:
    return httpx.get(f"{server.url}/openapi.json", timeout=10).json()


@pytest.fixture(scope="module")
def bare_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    d = launch_daemon(tmp_path_factory.mktemp("fuzz-daemon"), "--landlock")
    d.initialize()
    yield d
    d.stop()


@pytest.fixture(scope="module")
def daemon_document(bare_daemon: RunningDaemon) -> dict:
    with bare_daemon.client() as c:
        return c.http.get("/openapi.json").json()


# -- the judge -----------------------------------------------------------------------------------


class Tally:
    def __init__(self) -> None:
        self.cases: Counter[str] = Counter()
        self.statuses: Counter[int] = Counter()
        self.unsendable = 0
        self.known_bug_skips = 0
        self.nothing_to_violate: list[str] = []

    def summary(self) -> dict[str, Any]:
        return {
            "cases": sum(self.cases.values()),
            "by_operation_and_mode": dict(sorted(self.cases.items())),
            "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
            "unsendable_by_http_clients": self.unsendable,
            "skipped_as_known_bugs": self.known_bug_skips,
            "nothing_to_violate": self.nothing_to_violate,
        }


def _prepare(case: schemathesis.Case, base_url: str) -> httpx.Request | None:
    kwargs = case.as_transport_kwargs(base_url=base_url)
    body = kwargs.get("data")
    if "json" in kwargs:
        body = json.dumps(kwargs["json"]).encode()
    headers = {k: v for k, v in kwargs.get("headers", {}).items() if k.lower() != "connection"}
    try:
        return httpx.Request(
            kwargs["method"],
            kwargs["url"],
            params=kwargs.get("params") or None,
            headers=headers,
            content=body if body is not None else None,
        )
    except (httpx.LocalProtocolError, httpx.InvalidURL, UnicodeEncodeError, TypeError):
        return None


def assert_e2b_error_shape(path: str, response: httpx.Response) -> dict:
    """E2B's shapes (compat/e2b/errors.py): `{"code": <the status>, "message"}` on REST and
    control routes, `{"code": <Connect's lower-case name>, "message"}` on Connect RPC."""
    body = response.json()
    assert set(body) == {"code", "message"}, body
    assert isinstance(body["message"], str) and body["message"], body
    if path.startswith(E2B_CONNECT):
        assert isinstance(body["code"], str) and body["code"].islower(), body
    else:
        assert body["code"] == response.status_code, body
    assert "Traceback" not in response.text
    return body


def assert_connect_stream(response: httpx.Response) -> None:
    """A whole Connect server stream: envelopes, the last one its end (flag 0x02), whose
    error, if any, is in Connect's shape."""
    data, end = response.content, None
    while data:
        assert len(data) >= 5, data
        flags, length = data[0], int.from_bytes(data[1:5], "big")
        assert len(data) >= 5 + length, data
        message = json.loads(data[5 : 5 + length])
        data = data[5 + length :]
        if flags & 0x02:
            assert not data, "nothing may follow the end of the stream"
            end = message
    assert end is not None, "the stream has no end message"
    if "error" in end:
        assert set(end["error"]) == {"code", "message"}, end
        assert isinstance(end["error"]["code"], str), end


def _judge(case: schemathesis.Case, response: httpx.Response, validate: bool) -> None:
    if response.status_code == 502 and case.path.startswith(PORT_PATHS):
        assert response.json()["error"]["code"] == "SANDBOX_UNREACHABLE", response.text
        return
    assert response.status_code < 500, (
        f"{case.method} {case.formatted_path} -> {response.status_code} {response.text[:300]}"
        f"\n{case.as_curl_command()}"
    )
    if response.status_code >= 400:
        if case.path.startswith(E2B) or case.path in E2B_ROOT:
            assert_e2b_error_shape(case.path, response)
        else:
            assert_error_shape(response)
    elif response.headers.get("content-type", "").startswith("application/connect+json"):
        assert_connect_stream(response)
    elif validate:
        case.validate_response(response, checks=[not_a_server_error, response_schema_conformance])


def _bounded_exec(case: schemathesis.Case) -> None:
    """Keeps every command's (and code run's) time bounded: a valid timeout_s above 5 s
    becomes 5 s."""
    body = case.body
    if isinstance(body, dict) and case.path.endswith(("exec", "code/run")):
        t = body.get("timeout_s")
        if isinstance(t, int | float) and not isinstance(t, bool) and t > 5:
            body["timeout_s"] = 5


def _known_bug(case: schemathesis.Case) -> bool:
    """Inputs of the bugs pinned by xfail tests elsewhere: not tried again here."""
    body = case.body
    if case.method == "POST" and case.path == "/v1/sandboxes" and isinstance(body, dict):
        env = body.get("env")
        if isinstance(env, dict) and any(
            not k or "=" in k or "\0" in k or "\0" in str(v) for k, v in env.items()
        ):
            return True  # test_create_with_an_invalid_env_is_a_fast_400 (test_bad_input)
    return False


def fuzz(
    schema: Any,
    operations: list[tuple[str, str]],
    send: Callable[[schemathesis.Case, GenerationMode], httpx.Response | None],
    tally: Tally,
    *,
    path_parameters: dict[str, Any] | None = None,
    validate: bool = True,
    examples: int = EXAMPLES,
) -> None:
    for method, path in operations:
        operation = schema[path][method]
        for mode in MODES:
            _fuzz_one(
                operation.as_strategy(generation_mode=mode, path_parameters=path_parameters),
                f"{method} {path} [{mode.value}]",
                lambda case, mode=mode: send(case, mode),
                tally,
                validate and mode is GenerationMode.POSITIVE,
                examples,
            )


def _fuzz_one(
    strategy: Any,
    label: str,
    send: Callable[[schemathesis.Case], httpx.Response | None],
    tally: Tally,
    validate: bool,
    examples: int = EXAMPLES,
) -> None:
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=DERANDOMIZE,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def one(case: schemathesis.Case) -> None:
        if _known_bug(case):
            tally.known_bug_skips += 1
            return
        _bounded_exec(case)
        try:
            response = send(case)
        except httpx.LocalProtocolError:  # a header h11 will not send (a bare "Bearer ")
            response = None
        if response is None:
            tally.unsendable += 1
            return
        tally.cases[label] += 1
        tally.statuses[response.status_code] += 1
        _judge(case, response, validate)

    try:
        one()
    except Unsatisfiable:  # negative mode, and nothing in the operation can be made invalid
        tally.nothing_to_violate.append(label)


# -- 1. the router's own API ---------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_fuzz_router_api(server, raw_router_document, figures):
    key = server.create_key("router-fuzz")
    doc = router_document(raw_router_document)
    schema = schemathesis.openapi.from_dict(doc)
    own = [
        (method.upper(), path)
        for path, ops in doc["paths"].items()
        for method in ops
        if "{rest}" not in path and not path.startswith(E2B)  # the façade: test 4
    ]
    own.sort(key=lambda op: op == ("DELETE", "/v1/sandboxes/{sandbox_id}"))  # deletes last
    tally = Tally()
    with httpx.Client(timeout=CASE_TIMEOUT_S) as http:
        victim = http.post(
            f"{server.url}/v1/sandboxes", json={}, headers={"authorization": f"Bearer {key}"}
        )
        assert victim.status_code == 201, victim.text

        def send(case: schemathesis.Case, _: GenerationMode) -> httpx.Response | None:
            request = _prepare(case, server.url)
            if request is None:
                return None
            request.headers["authorization"] = f"Bearer {key}"
            return http.send(request)

        with_id = [op for op in own if "{sandbox_id}" in op[1]]
        fuzz(schema, own, send, tally)  # random sandbox ids
        fuzz(schema, with_id, send, tally, path_parameters={"sandbox_id": victim.json()["id"]})
        for s in http.get(
            f"{server.url}/v1/sandboxes", headers={"authorization": f"Bearer {key}"}
        ).json()["sandboxes"]:
            http.delete(
                f"{server.url}/v1/sandboxes/{s['id']}", headers={"authorization": f"Bearer {key}"}
            )
    figures["fuzz: router API"] = tally.summary()


# -- 2. the daemon's /v1 API, through the router, into a real cell --------------------------------


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_fuzz_daemon_api_through_the_router(server, daemon_document, figures):
    key = server.create_key("proxy-fuzz")
    schema = schemathesis.openapi.from_dict(daemon_document)
    operations = [
        (method.upper(), path)
        for path, ops in daemon_document["paths"].items()
        for method in ops
        if path not in PROXIED
    ]
    tally = Tally()
    headers = {"authorization": f"Bearer {key}"}
    with httpx.Client(timeout=CASE_TIMEOUT_S, headers=headers) as http:
        r = http.post(f"{server.url}/v1/sandboxes", json={})
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        base = f"{server.url}/v1/sandboxes/{sid}"

        def send(case: schemathesis.Case, _: GenerationMode) -> httpx.Response | None:
            request = _prepare(case, base)  # /v1/x -> /v1/sandboxes/{sid}/v1/x: fixed below
            if request is None:
                return None
            url = request.url
            path = url.raw_path.replace(f"/v1/sandboxes/{sid}/v1/".encode(), b"/", 1)
            request.url = url.copy_with(raw_path=f"/v1/sandboxes/{sid}".encode() + path)
            request.headers["authorization"] = f"Bearer {key}"
            return http.send(request)

        fuzz(schema, operations, send, tally)
        # The sandbox survived it all.
        r = http.post(f"{base}/exec", json={"command": "echo alive"})
        assert r.status_code == 200 and r.json()["stdout"] == "alive\n", r.text
        http.delete(base)
    figures["fuzz: daemon API through the router"] = tally.summary()


# -- 3. a bare daemon, every operation signed --------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_fuzz_bare_daemon_api(bare_daemon, daemon_document, figures):
    schema = schemathesis.openapi.from_dict(daemon_document)
    operations = [
        (method.upper(), path)
        for path, ops in daemon_document["paths"].items()
        for method in ops
        if (method.upper(), path) not in NOT_ON_THE_HOST
    ]
    tally = Tally()
    transport = httpx.HTTPTransport(uds=str(bare_daemon.uds))
    with httpx.Client(transport=transport, timeout=CASE_TIMEOUT_S) as http:

        def send(case: schemathesis.Case, _: GenerationMode) -> httpx.Response | None:
            request = _prepare(case, "http://daemon")
            if request is None:
                return None
            if case.path.startswith("/v1/"):
                target = request.url.raw_path.decode("latin-1")
                token = tokens.mint_request_token(
                    bare_daemon.session_key,
                    bare_daemon.sandbox_id,
                    request.method,
                    target,
                    request.read(),
                )
                request.headers["authorization"] = f"Bearer {token}"
            return http.send(request)

        fuzz(schema, operations, send, tally)
    with bare_daemon.client() as c:
        assert c.health()["initialized"] is True
        assert c.exec("echo alive")["stdout"] == "alive\n"
    figures["fuzz: bare daemon API"] = tally.summary()


# -- 4. the E2B façade, with a real key, sandbox and access token --------------------------------


def _e2b_order(op: tuple[str, str]) -> int:
    """envd's operations while the sandbox runs, then the control API's, those that stop or
    end the sandbox last (a valid timeout can end it too)."""
    method, path = op
    if not path.startswith(E2B_CONTROL):
        return 0
    if path.endswith(("/pause", "/resume")):
        return 2
    return 3 if method == "DELETE" or path.endswith("/timeout") else 1


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_fuzz_e2b_facade(server, raw_router_document, figures):
    key = server.create_key("e2b-fuzz")
    doc = router_document(raw_router_document)
    schema = schemathesis.openapi.from_dict(doc)
    operations = sorted(
        (
            (method.upper(), path)
            for path, ops in doc["paths"].items()
            if path.startswith(E2B)
            for method in ops
        ),
        key=_e2b_order,
    )
    assert len(operations) > 30, operations
    control = [op for op in operations if op[1].startswith(E2B_CONTROL)]
    in_sandbox = [op for op in operations if not op[1].startswith(E2B_CONTROL)]
    tally = Tally()
    api_key = {"x-api-key": key}
    with httpx.Client(timeout=CASE_TIMEOUT_S) as http:
        made = http.post(
            f"{server.url}/e2b/sandboxes", json={"templateID": "base"}, headers=api_key
        )
        assert made.status_code == 201, made.text
        victim = made.json()
        envd = {"e2b-sandbox-id": victim["sandboxID"], "x-access-token": victim["envdAccessToken"]}

        def send(case: schemathesis.Case, _: GenerationMode) -> httpx.Response | None:
            request = _prepare(case, server.url)
            if request is None:
                return None
            if case.path.startswith(E2B_CONTROL):
                request.headers.update(api_key)
            else:
                request.headers.update(envd)
                interpreter = case.path.startswith(E2B_INTERPRETER)
                request.headers["e2b-sandbox-port"] = "49999" if interpreter else "49983"
            return http.send(request)

        fuzz(schema, in_sandbox, send, tally, examples=FACADE_EXAMPLES)
        # The sandbox survived it all.
        stat = f"{server.url}/e2b/filesystem.Filesystem/Stat"
        alive = http.post(stat, json={"path": "/home/user"}, headers=envd)
        assert alive.status_code == 200, alive.text
        fuzz(schema, control, send, tally, examples=FACADE_EXAMPLES)  # random sandbox ids
        with_id = [op for op in control if "{sandbox_id}" in op[1]]
        victim_id = {"sandbox_id": victim["sandboxID"]}
        fuzz(schema, with_id, send, tally, path_parameters=victim_id, examples=FACADE_EXAMPLES)
        for s in http.get(f"{server.url}/e2b/sandboxes", headers=api_key).json():
            http.delete(f"{server.url}/e2b/sandboxes/{s['sandboxID']}", headers=api_key)
    figures["fuzz: E2B façade"] = tally.summary()


# -- the documents themselves ---------------------------------------------------------------------


def test_daemon_document_declares_what_it_uses(daemon_document):
    assert undeclared_path_parameters(daemon_document) == []


def test_router_document_declares_its_path_parameters(raw_router_document):
    assert undeclared_path_parameters(raw_router_document) == []
    assert not any(":" in path for path in raw_router_document["paths"])
