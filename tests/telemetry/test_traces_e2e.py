"""Traces of a real `sandcell serve` exported over OTLP/HTTP to a receiver on loopback: an
exec through /v1 and a command through the unmodified e2b SDK each make one connected trace
of router and daemon spans (SPEC §20)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from sdk.helpers import stop_and_clean
from support.server import SMALL_TEMPLATE, RunningServer, start_server

from .receiver import Received, Receiver, receiving
from .recording import PARENT_ID, TRACE_ID, TRACEPARENT

pytestmark = pytest.mark.slow
COMMAND = "echo traced-$((40+2))-marker"


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with receiving() as found:
        yield found


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, receiver: Receiver) -> Iterator[RunningServer]:
    config = (
        SMALL_TEMPLATE.format(warm_pool=1) + f'\n[telemetry]\notlp_endpoint = "{receiver.url}"\n'
    )
    running = start_server(
        tmp_path_factory.mktemp("traces") / "data",
        config_text=config,
        extra_env={"OTEL_BSP_SCHEDULE_DELAY": "50"},  # export within the tests' patience
    )
    try:
        yield running
    finally:
        stop_and_clean(running)


@pytest.fixture(scope="module")
def api(server: RunningServer) -> Iterator[httpx.Client]:
    with server.client(server.create_key("tracer")) as client:
        yield client


@pytest.fixture(scope="module")
def sandbox_id(api: httpx.Client) -> Iterator[str]:
    reply = api.post("/v1/sandboxes", json={}, headers={"traceparent": TRACEPARENT})
    assert reply.status_code == 201, reply.text
    yield reply.json()["id"]
    api.delete(f"/v1/sandboxes/{reply.json()['id']}")


def _traceparent(digit: str, flags: str = "01") -> str:
    """A traceparent of the trace id `digit` * 32 (each test its own), parent PARENT_ID."""
    return f"00-{digit * 32}-{PARENT_ID}-{flags}"


def _exec(
    api: httpx.Client, sandbox_id: str, command: str = "true", **headers: str | bytes
) -> httpx.Response:
    return api.post(f"/v1/sandboxes/{sandbox_id}/exec", json={"command": command}, headers=headers)


def _children(spans: list[Received], parent: Received) -> dict[str, Received]:
    return {s.name: s for s in spans if s.parent_id == parent.span_id}


def _one(spans: list[Received], name: str, trace_id: str | None = None) -> Received:
    found = [s for s in spans if s.name == name and trace_id in (None, s.trace_id)]
    assert len(found) == 1, (name, [s.name for s in spans])
    return found[0]


def test_an_exec_with_a_traceparent_is_one_connected_trace(
    api: httpx.Client, receiver: Receiver, sandbox_id: str
) -> None:
    reply = _exec(api, sandbox_id, COMMAND, traceparent=_traceparent("a"), tracestate="vendor=o")
    assert reply.status_code == 200 and reply.json()["stdout"] == "traced-42-marker\n"
    assert "sandcell-spans" not in reply.headers
    spans = receiver.wait_for(
        lambda got: any(s.name == "exec.run" and s.trace_id == "a" * 32 for s in got)
    )
    trace = [s for s in spans if s.trace_id == "a" * 32]
    server_span = _one(trace, "POST /v1/sandboxes/{sandbox_id}/exec")
    assert server_span.parent_id == PARENT_ID and server_span.kind == 2  # SERVER
    assert server_span.attributes["sandcell.sandbox_id"] == sandbox_id
    assert server_span.attributes["sandcell.principal"] == "tracer"
    assert server_span.attributes["http.response.status_code"] == 200
    hop = _children(trace, server_span)["daemon POST /v1/exec"]
    assert hop.kind == 3 and hop.attributes["sandcell.sandbox_id"] == sandbox_id  # CLIENT
    cell = _children(trace, hop)
    assert set(cell) == {"exec.spawn", "exec.run"}
    assert cell["exec.run"].attributes["sandcell.exit_code"] == 0
    for span in cell.values():
        assert hop.start <= span.start <= span.end <= hop.end
    assert server_span.start <= hop.start <= hop.end <= server_span.end
    assert {s.service for s in trace} == {"sandcell"}
    # Never in a span: the command, its output.
    text = json.dumps([s.attributes for s in spans])
    assert "traced-" not in text and "marker" not in text


def test_a_create_has_its_claim_span(receiver: Receiver, sandbox_id: str) -> None:
    spans = receiver.wait_for(lambda got: any(s.name == "sandbox.claim" for s in got))
    create = _one(spans, "POST /v1/sandboxes", TRACE_ID)
    assert create.parent_id == PARENT_ID
    claim = _children(spans, create)["sandbox.claim"]
    assert claim.attributes == {"sandcell.template": "default", "sandcell.warm": True}
    # The warm pool's cells were started and initialised in the background: traces of their own.
    started = receiver.wait_for(lambda got: any(s.name == "cell.init" for s in got))
    assert any(s.name == "cell.start" and s.parent_id == "" for s in started)


@pytest.mark.parametrize(
    "bad",
    [
        f"00-{'b' * 32}-{PARENT_ID}-01-extra",  # version 00 has nothing after its flags
        f"ff-{'b' * 32}-{PARENT_ID}-01",  # version ff is invalid
        f"00-{'B' * 32}-{PARENT_ID}-01",  # upper case
        f"00-{'b' * 32}-{'0' * 16}-01",  # an all-zero parent
        f"00-{'0' * 32}-{PARENT_ID}-01",
        f"00-{'b' * 31}-{PARENT_ID}-01",
        "garbage\u00e9",
        "",
    ],
)
def test_a_bad_traceparent_is_ignored(
    api: httpx.Client, receiver: Receiver, sandbox_id: str, bad: str
) -> None:
    before = len(receiver.spans)
    reply = _exec(api, sandbox_id, traceparent=bad.encode())
    assert reply.status_code == 200, reply.text
    spans = receiver.wait_for(
        lambda got: any(s.name == "exec.run" for s in got[before:]), timeout_s=15
    )
    fresh = [s for s in spans[before:] if s.name == "POST /v1/sandboxes/{sandbox_id}/exec"]
    assert fresh and all(s.parent_id == "" for s in fresh)  # a trace of its own
    assert not any(s.trace_id == "b" * 32 for s in spans)


def test_two_traceparents_are_as_bad_as_one_malformed(
    server: RunningServer, api: httpx.Client, receiver: Receiver, sandbox_id: str
) -> None:
    before = len(receiver.spans)
    headers = [("traceparent", _traceparent("c"))] * 2
    with httpx.Client(base_url=server.url, headers=api.headers) as client:
        reply = client.post(
            f"/v1/sandboxes/{sandbox_id}/exec", json={"command": "true"}, headers=headers
        )
    assert reply.status_code == 200
    spans = receiver.wait_for(lambda got: any(s.name == "exec.run" for s in got[before:]))
    assert not any(s.trace_id == "c" * 32 for s in spans)


def test_a_command_through_the_e2b_sdk_is_one_connected_trace(
    server: RunningServer, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    from e2b import Sandbox

    url = f"{server.url}/e2b"
    monkeypatch.setenv("E2B_API_URL", url)
    monkeypatch.setenv("E2B_SANDBOX_URL", url)
    monkeypatch.setenv("E2B_API_KEY", server.create_key("e2b-tracer"))
    sandbox = Sandbox.create(timeout=120)
    try:
        result = sandbox.commands.run(COMMAND)
    finally:
        sandbox.kill()
    assert result.stdout == "traced-42-marker\n"
    spans = receiver.wait_for(lambda got: any(s.name == "process.spawn" for s in got))
    spawn = _one(spans, "process.spawn")
    trace = [s for s in spans if s.trace_id == spawn.trace_id]
    by_id = {s.span_id: s for s in trace}
    hop = by_id[spawn.parent_id]
    assert hop.name == "daemon POST /v1/processes"
    front = by_id[hop.parent_id]
    assert front.name == "POST /e2b/process.Process/Start"
    assert front.kind == 2 and front.parent_id == ""  # the SDK sends no traceparent
    assert front.attributes["sandcell.sandbox_id"] == sandbox.sandbox_id
    assert front.start <= hop.start <= spawn.start <= spawn.end <= hop.end <= front.end
    assert "traced-" not in json.dumps([s.attributes for s in spans])


def test_an_unsampled_traceparent_is_followed_and_records_nothing(
    api: httpx.Client, receiver: Receiver, sandbox_id: str
) -> None:
    reply = _exec(api, sandbox_id, traceparent=_traceparent("d", flags="00"))
    assert reply.status_code == 200 and "sandcell-spans" not in reply.headers
    # A sampled call after it: once its spans are in, the unsampled one's would be too.
    _exec(api, sandbox_id, traceparent=_traceparent("e"))
    spans = receiver.wait_for(
        lambda got: any(s.trace_id == "e" * 32 and s.name == "exec.run" for s in got)
    )
    assert not any(s.trace_id == "d" * 32 for s in spans)


def test_a_cold_create_has_its_cell_start_and_init(api: httpx.Client, receiver: Receiver) -> None:
    traceparent = _traceparent("f")
    # An env of its own: no pooled cell fits, one is started for this sandbox.
    reply = api.post(
        "/v1/sandboxes", json={"env": {"X": "1"}}, headers={"traceparent": traceparent}
    )
    assert reply.status_code == 201, reply.text
    api.delete(f"/v1/sandboxes/{reply.json()['id']}")
    spans = receiver.wait_for(
        lambda got: any(s.trace_id == "f" * 32 and s.name == "cell.init" for s in got)
    )
    create = _one(spans, "POST /v1/sandboxes", "f" * 32)
    children = _children(spans, create)
    assert set(children) == {"sandbox.claim", "cell.start", "cell.init"}
    assert children["sandbox.claim"].attributes["sandcell.warm"] is False
    assert children["cell.init"].attributes["sandcell.sandbox_id"] == reply.json()["id"]
    assert children["cell.start"].end <= children["cell.init"].start


def test_a_callers_path_and_ids_never_name_a_span(api: httpx.Client, receiver: Receiver) -> None:
    traceparent = _traceparent("1")
    long_id = "sbx-" + "z" * 100
    reply = api.post(
        f"/v1/sandboxes/{long_id}/ports/8080/private-path",
        json={},
        headers={"traceparent": traceparent},
    )
    assert reply.status_code == 404
    spans = receiver.wait_for(lambda got: any(s.trace_id == "1" * 32 for s in got))
    (span,) = [s for s in spans if s.trace_id == "1" * 32]
    assert span.name == "POST /v1/sandboxes/{sandbox_id}/ports/{n}/{path}"
    assert "sandcell.sandbox_id" not in span.attributes
    assert span.attributes["http.response.status_code"] == 404
    assert "private-path" not in json.dumps(span.attributes) and "zzzz" not in span.name
