"""The hop's span and the daemon's steps, in-process: the core's `Hop` against the real
daemon app (served by uvicorn on a unix socket in this loop), and against a hostile one."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

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

from .recording import PARENT_ID, TRACEPARENT, Recorded, recorded

SANDBOX_ID = "sbx-traced"
SPANS = "sandcell-spans"


@pytest.fixture(scope="module", autouse=True)
def _spawner() -> None:
    start_unconfined_spawner()


def _daemon(workspace: Path, bootstrap: tokens.PrivateKey) -> Starlette:
    return in_process_daemon(SANDBOX_ID, workspace, bootstrap)


@contextlib.asynccontextmanager
async def through_hop(app: Starlette, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    """A client whose calls go through a `Hop` to `app` on a unix socket."""
    uds = tmp_path / "daemon.sock"

    def dialer_for(endpoint: dict[str, Any]) -> tuple[Dial, bytes]:
        return dialer({"uds": str(uds)})

    real = hasattr(app.state, "daemon")
    session = await _initialised(app) if real else tokens.generate_p256()
    record = sandbox_record(SANDBOX_ID, {"uds": "x"})
    async with served(app, uds), stored(tmp_path, record, session) as store:
        hop = Hop(store, dialer_for=dialer_for)
        async with proxy_client(hop, record) as client:
            yield client
        await hop.close()


_BOOTSTRAP = tokens.generate_p256()


async def _initialised(app: Starlette) -> tokens.PrivateKey:
    session = tokens.generate_p256()
    token = tokens.mint_bootstrap_token(_BOOTSTRAP, SANDBOX_ID, tokens.public_pem(session))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://d") as d:
        assert (await d.post("/init", json={"token": token})).status_code == 200
    return session


@pytest.fixture
def tracing() -> Any:
    with recorded() as recording:
        yield recording


@pytest.mark.anyio
async def test_the_daemons_steps_become_children_of_the_hop(
    tmp_path: Path, tracing: Recorded
) -> None:
    (tmp_path / "ws").mkdir()
    async with through_hop(_daemon(tmp_path / "ws", _BOOTSTRAP), tmp_path) as client:
        base = f"/v1/sandboxes/{SANDBOX_ID}"
        # The caller's own trace context is replaced by the hop's, never passed on as it is.
        reply = await client.post(
            f"{base}/exec",
            json={"command": "echo secret-ish"},
            headers={"traceparent": TRACEPARENT},
        )
        assert reply.status_code == 200 and reply.json()["stdout"] == "secret-ish\n"
        assert SPANS not in reply.headers  # the router's, not the caller's
        assert (await client.put(f"{base}/files?path=a.txt", content=b"abc")).status_code == 200

    spans = tracing.spans()
    hop = next(s for s in spans if s.name == "daemon POST /v1/exec")
    assert hop.attributes is not None and hop.attributes["sandcell.sandbox_id"] == SANDBOX_ID
    assert hop.parent is None or hop.parent.span_id != int(PARENT_ID, 16)  # no server span here
    children = {s.name: s for s in spans if s.parent and s.parent.span_id == hop.context.span_id}
    assert set(children) == {"exec.spawn", "exec.run"}
    run = children["exec.run"]
    assert run.attributes == {
        "sandcell.exit_code": 0,
        "sandcell.timed_out": False,
        "sandcell.origin": "cell",
    }
    for child in children.values():
        assert child.context.trace_id == hop.context.trace_id
        assert hop.start_time <= child.start_time <= child.end_time <= hop.end_time
    write = next(s for s in spans if s.name == "daemon PUT /v1/files")
    (written,) = [s for s in spans if s.parent and s.parent.span_id == write.context.span_id]
    assert written.name == "file.write" and written.attributes["sandcell.bytes"] == 3
    # What the spans carry: no command text, no body.
    text = json.dumps([dict(s.attributes or {}) for s in spans])
    assert "secret-ish" not in text and "echo" not in text


HOSTILE = [
    {"n": "exec.run", "s": 1, "e": 2**62, "a": {"exit_code": 0}},  # clamped inside the hop
    {"n": "exec.run", "s": 5, "e": 6, "a": {"command": 1}},  # a key it may not carry
    {"n": "exec.run", "s": 5, "e": 6, "a": {"exit_code": "rm -rf /"}},  # text
    {"n": "made.up", "s": 5, "e": 6},
    {"n": "exec.spawn", "s": True, "e": 6},
    {"n": "exec.spawn", "s": -5, "e": 6},
    {"n": "exec.spawn", "s": 5.5, "e": 6},
    {"n": "exec.spawn", "s": 5, "e": 6, "x": 1},
    "exec.spawn",
]


def _hostile_daemon(header: bytes | None) -> Starlette:
    """A daemon that answers every exec with `header` as its spans (and no checks at all)."""

    async def exec_(request: Request) -> JSONResponse:
        response = JSONResponse({"exit_code": 0, "stdout": "", "stderr": ""})
        if header is not None:
            response.raw_headers.append((b"sandcell-spans", header))
        return response

    return Starlette(routes=[Route("/v1/exec", exec_, methods=["POST"])])


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("header", "kept"),
    [
        (json.dumps(HOSTILE).encode(), 1),  # the one well-formed span, clamped
        (b"[" * 1900, 0),  # nested past the parser's recursion limit
        (json.dumps([{"n": "exec.spawn", "s": 1, "e": 2, "a": {}}] * 80).encode(), 0),  # > bound
        (json.dumps([{"n": "exec.spawn", "s": 1, "e": 2}] * 20).encode(), 8),  # at most 8 read
        (b"not json \xff", 0),
        (b'{"n": "exec.run"}', 0),
        (b'[{"n": "exec.spawn", "s": 1' + b"0" * 1500 + b', "e": 1}]', 0),  # an int too big
        (json.dumps([{"n": "exec.spawn", "s": 1, "e": 2, "a": []}]).encode(), 0),
    ],
    ids=["mixed", "deep", "oversized", "many", "bytes", "object", "huge-int", "attrs-list"],
)
async def test_hostile_span_data_is_dropped(
    tmp_path: Path, tracing: Recorded, header: bytes, kept: int
) -> None:
    async with through_hop(_hostile_daemon(header), tmp_path) as client:
        reply = await client.post(f"/v1/sandboxes/{SANDBOX_ID}/exec", json={"command": "true"})
        assert reply.status_code == 200
        assert SPANS not in reply.headers
    spans = tracing.spans()
    hop = next(s for s in spans if s.name == "daemon POST /v1/exec")
    cell = [s for s in spans if s.parent and s.parent.span_id == hop.context.span_id]
    assert len(cell) == kept
    for span in cell:
        assert span.name in ("exec.spawn", "exec.run")
        assert hop.start_time <= span.start_time <= span.end_time <= hop.end_time
        assert set(span.attributes or {}) <= {"sandcell.exit_code", "sandcell.origin"}


def _echoing_daemon() -> Starlette:
    """A daemon that answers with the trace headers it was sent."""

    async def exec_(request: Request) -> JSONResponse:
        return JSONResponse({k: request.headers.getlist(k) for k in ("traceparent", "tracestate")})

    return Starlette(routes=[Route("/v1/exec", exec_, methods=["POST"])])


@pytest.mark.anyio
async def test_the_daemon_gets_the_hops_trace_context_not_the_callers(
    tmp_path: Path, tracing: Recorded
) -> None:
    async with through_hop(_echoing_daemon(), tmp_path) as client:
        reply = await client.post(
            f"/v1/sandboxes/{SANDBOX_ID}/exec",
            json={},
            headers={"traceparent": TRACEPARENT, "tracestate": "caller=1"},
        )
    (hop,) = tracing.named("daemon POST /v1/exec")
    expected = f"00-{hop.context.trace_id:032x}-{hop.context.span_id:016x}-01"
    assert reply.json() == {"traceparent": [expected], "tracestate": []}


def test_span_names_keep_few_values() -> None:
    from sandcell.telemetry.otel import _route

    route = "/v1/sandboxes/{sandbox_id}/{rest:path}"
    assert _route(route, {"sandbox_id": "sbx-1", "rest": "exec"}) == (
        "/v1/sandboxes/{sandbox_id}/exec"
    )
    assert _route(route, {"sandbox_id": "sbx-1", "rest": "processes/4711/stdin"}) == (
        "/v1/sandboxes/{sandbox_id}/processes/{n}/stdin"
    )
    assert _route("/e2b/process.Process/Start", {}) == "/e2b/process.Process/Start"
    # A caller's own paths and ids never name a span.
    for rest, named in [
        ("ports/8080/api/users/42", "ports/{n}/{path}"),
        ("files/list", "files/list"),
        ("EXEC", "{path}"),
        ("exec/" + "x" * 40, "exec/{path}"),
        ("a/b/c/d/e/f/g/h/i", "a/b/c/d/e/f/g/h/{path}"),
        ("sbx-\u00e9t\u00e9/x", "{path}"),
        ("\u00b3/stdin", "{path}"),
    ]:
        assert _route(route, {"rest": rest}) == f"/v1/sandboxes/{{sandbox_id}}/{named}", rest


@pytest.mark.parametrize(
    ("values", "kept"),
    [
        ([b"vendor=opaque,other@tenant=x y"], [("vendor", "opaque"), ("other@tenant", "x y")]),
        ([b"a=1", b" , b=2"], [("a", "1"), ("b", "2")]),
        ([b"a=1,a=2"], []),  # a key twice
        ([b"A=1"], []),  # upper case
        ([b"a=1,\x1b[31mforged=line"], []),  # the whole header dropped, not just the member
        ([b"a=" + b"x" * 600], []),  # past 512 bytes
        ([b",".join(b"k%d=v" % i for i in range(33))], []),  # more than 32 members
    ],
)
def test_a_callers_tracestate_is_checked_quietly(
    values: list[bytes], kept: list[tuple[str, str]], caplog: pytest.LogCaptureFixture
) -> None:
    from sandcell.telemetry.otel import trace_state

    caplog.set_level("DEBUG")
    assert list(trace_state(values).items()) == kept
    assert caplog.records == []  # no caller's text in the logs


@pytest.mark.anyio
async def test_the_callers_trace_and_tracestate_travel_on_under_the_hops_span(
    tmp_path: Path, tracing: Recorded
) -> None:
    from opentelemetry import context

    from sandcell.telemetry.otel import remote_parent

    caller = remote_parent([(b"traceparent", TRACEPARENT.encode()), (b"tracestate", b"caller=1")])
    token = context.attach(caller)  # as the router's server span of the call would be
    try:
        async with through_hop(_echoing_daemon(), tmp_path) as client:
            reply = await client.post(f"/v1/sandboxes/{SANDBOX_ID}/exec", json={})
    finally:
        context.detach(token)
    (hop,) = tracing.named("daemon POST /v1/exec")
    assert hop.parent is not None and hop.parent.span_id == int(PARENT_ID, 16)
    assert reply.json() == {
        "traceparent": [f"00-{hop.context.trace_id:032x}-{hop.context.span_id:016x}-01"],
        "tracestate": ["caller=1"],
    }
    assert f"{hop.context.trace_id:032x}" == TRACEPARENT.split("-")[1]
