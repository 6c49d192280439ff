"""Hostile bodies through both façades and /v1, sent for real to a real router and cells.

Issue 26, items 7 and 8: JSON nested 100,000 deep was a 500 (a RecursionError) on E2B's
envd; multipart forms were parsed whole on the event loop (2 MiB of tiny parts held every
client's /healthz for seconds), and a form nested 3,000 deep was a 500 on both façades.
Each test here performs the attack and checks for a clear 4xx in the protocol's own error
shape, or, for the flood, that /healthz of the same router keeps answering at once.
"""

from __future__ import annotations

import json
import random
import struct
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from sandcell.compat.e2b.files import MAX_UPLOAD
from sandcell.errors import ServiceError
from sandcell.http.bodies import MAX_JSON_DEPTH, json_value
from sdk.helpers import served
from support.server import RunningServer

pytestmark = pytest.mark.slow
PICOD = "/agentcube/v1/namespaces/default/code-interpreters/default/invocations/api"
DEEP = 100_000
DEEP_ARRAY = b"[" * DEEP + b"]" * DEEP
DEEP_OBJECT = b'{"a":' * DEEP + b"1" + b"}" * DEEP
HEALTHZ_BOUND_S = 0.5  # generous: /healthz answers in a millisecond or two on a free loop


@dataclass
class Sandboxes:
    key: str
    e2b_id: str
    envd_token: str
    session_id: str


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    yield from served(tmp_path_factory.mktemp("hostile-bodies"), warm_pool=1)


@pytest.fixture(scope="module")
def boxes(server: RunningServer) -> Iterator[Sandboxes]:
    """One sandbox made through E2B's control API and one agentcube session, by one key."""
    key = server.create_key("hostile")
    with server.client(key) as http:
        made = http.post("/e2b/sandboxes", json={"templateID": "base"}, headers={"x-api-key": key})
        session = http.post("/agentcube/v1/code-interpreter", json={"name": "default"})
    sandbox, session_id = made.raise_for_status().json(), session.raise_for_status().json()
    yield Sandboxes(key, sandbox["sandboxID"], sandbox["envdAccessToken"], session_id["sessionId"])
    with server.client(key) as http:
        http.delete(f"/e2b/sandboxes/{sandbox['sandboxID']}", headers={"x-api-key": key})
        http.delete(f"/agentcube/v1/code-interpreter/sessions/{session_id['sessionId']}")


def _envd(server: RunningServer, boxes: Sandboxes, port: str = "49983") -> httpx.Client:
    headers = {
        "E2b-Sandbox-Id": boxes.e2b_id,
        "E2b-Sandbox-Port": port,
        "X-Access-Token": boxes.envd_token,
    }
    return httpx.Client(base_url=f"{server.url}/e2b", headers=headers, timeout=60)


def _picod(server: RunningServer, boxes: Sandboxes) -> httpx.Client:
    headers = {"x-agentcube-session-id": boxes.session_id}
    return httpx.Client(base_url=server.url + PICOD, headers=headers, timeout=60)


def _nested(depth: int, body: bytes = b"x") -> bytes:
    """An array `depth` deep around `body`."""
    return b"[" * depth + body + b"]" * depth


def _spec_400(answer: httpx.Response) -> None:
    """SPEC §1's shape, BAD_REQUEST."""
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["code"] == "BAD_REQUEST"


# --- item 7: JSON nested deeper than anything parses ------------------------------------


@pytest.mark.parametrize("body", [DEEP_ARRAY, DEEP_OBJECT], ids=["array", "object"])
@pytest.mark.parametrize(
    "path", ["/filesystem.Filesystem/Stat", "/process.Process/List", "/process.Process/Update"]
)
def test_deep_json_to_an_envd_unary_call_is_invalid_argument(
    server: RunningServer, boxes: Sandboxes, path: str, body: bytes
) -> None:
    with _envd(server, boxes) as envd:
        answer = envd.post(path, content=body, headers={"content-type": "application/json"})
    assert answer.status_code == 400, answer.text
    assert answer.json()["code"] == "invalid_argument"  # Connect's shape: the SDK's own error


def test_deep_json_to_an_envd_stream_ends_it_with_invalid_argument(
    server: RunningServer, boxes: Sandboxes
) -> None:
    """A server stream's request message is in an envelope; its error ends the stream."""
    message = b'{"process": {"cmd": "ls", "args": ' + _nested(DEEP, b"") + b"}}"
    envelope = struct.pack(">BI", 0, len(message)) + message
    with _envd(server, boxes) as envd:
        answer = envd.post(
            "/process.Process/Start",
            content=envelope,
            headers={"content-type": "application/connect+json"},
        )
    assert answer.status_code == 200, answer.text
    flags, length = struct.unpack_from(">BI", answer.content)
    assert flags == 0x02 and len(answer.content) == 5 + length  # only the end of the stream
    assert json.loads(answer.content[5:])["error"]["code"] == "invalid_argument"


def _branched(depth: int) -> bytes:
    """An array `depth` deep whose openers make no single run (a branch in the middle)."""
    above = depth // 2
    below = depth - above - 1
    return b"[" * above + b"[[]]," + b"[" * below + b"[]" + b"]" * (above + below)


@pytest.mark.parametrize("shape", [lambda d: _nested(d, b"1"), _branched], ids=["run", "branch"])
def test_json_as_deep_as_the_bound_is_served_and_one_deeper_is_not(
    server: RunningServer, boxes: Sandboxes, shape
) -> None:
    """The bound is a depth no real message reaches, not a refusal of nesting as such."""
    with _envd(server, boxes) as envd:
        for depth, status in ((MAX_JSON_DEPTH - 1, 200), (MAX_JSON_DEPTH, 400)):
            body = b'{"path": "/home/user", "x": ' + shape(depth) + b"}"  # one level more
            assert _depth(json.loads(body)) == depth + 1
            answer = envd.post("/filesystem.Filesystem/Stat", content=body)
            assert answer.status_code == status, (depth, answer.text)


def _depth(value: object) -> int:
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    return 0


def test_the_depth_bound_agrees_with_a_parser_on_random_json() -> None:
    """The bound is found by scanning bytes, not parsing: on random JSON around the bound
    (strings holding brackets, quotes and escapes included) it refuses exactly the values
    deeper than it."""
    rng = random.Random(26)
    scalars = ["1", '"a[\\"{"', "[]", "{}", "null", '"]]}"']

    def value(budget: list[int]) -> str:
        if budget[0] <= 0 or rng.random() < 0.1:
            return rng.choice(scalars)
        budget[0] -= 1
        kids = [value(budget) for _ in range(rng.choice([1, 1, 1, 2]))]
        if rng.random() < 0.5:
            return "[" + ",".join(kids) + "]"
        return "{" + ",".join(f'"k{i}":{kid}' for i, kid in enumerate(kids)) + "}"

    outcomes = set()
    for _ in range(3_000):
        raw = value([rng.randint(30, 200)]).encode()
        deeper = _depth(json.loads(raw)) > MAX_JSON_DEPTH
        try:
            json_value(raw)
            refused = False
        except ServiceError as exc:
            refused = "deeper" in exc.message
        assert refused == deeper, raw
        outcomes.add(deeper)
    assert outcomes == {True, False}


def test_deep_json_to_e2b_control_and_interpreter_is_a_400(
    server: RunningServer, boxes: Sandboxes
) -> None:
    with server.client() as http:
        headers = {"x-api-key": boxes.key, "content-type": "application/json"}
        for path in ("/e2b/sandboxes", f"/e2b/sandboxes/{boxes.e2b_id}/timeout"):
            answer = http.post(path, content=DEEP_OBJECT, headers=headers)
            assert answer.status_code == 400, (path, answer.text)
            assert answer.json()["code"] == 400  # E2B's REST shape
    with _envd(server, boxes, port="49999") as interpreter:
        for path in ("/execute", "/contexts"):
            answer = interpreter.post(path, content=DEEP_ARRAY)
            assert answer.status_code == 400, (path, answer.text)


def test_deep_json_to_agentcube_is_a_400(server: RunningServer, boxes: Sandboxes) -> None:
    with server.client(boxes.key) as http:  # its body limit is 64 KiB: 20,000 deep then
        _spec_400(http.post("/agentcube/v1/code-interpreter", content=_nested(20_000, b"")))
        metadata = b'{"name": "default", "metadata": {"a": ' + _nested(20_000, b"1") + b"}}"
        _spec_400(http.post("/agentcube/v1/code-interpreter", content=metadata))
    with _picod(server, boxes) as picod:
        _spec_400(picod.post("/execute", content=DEEP_OBJECT))
        _spec_400(picod.post("/files", content=DEEP_ARRAY))


def test_deep_json_to_the_router_and_the_daemon_is_a_400(
    server: RunningServer, boxes: Sandboxes
) -> None:
    """The router's own bodies (pydantic) and those it relays to the daemon (msgspec, typed
    shapes) were bounded already: kept so by this test."""
    sandbox = f"/v1/sandboxes/{boxes.e2b_id}"
    with server.client(boxes.key) as http:
        _spec_400(http.post("/v1/sandboxes", content=DEEP_OBJECT))
        _spec_400(http.post(f"{sandbox}/keepalive", content=DEEP_ARRAY))
        for rest in ("exec", "processes", "files/mkdir", "code/run", "code/contexts"):
            _spec_400(http.post(f"{sandbox}/{rest}", content=DEEP_OBJECT))
            unknown = b'{"command": ["true"], "zzz": ' + DEEP_ARRAY + b"}"
            _spec_400(http.post(f"{sandbox}/{rest}", content=unknown))


# --- item 8: multipart forms, read as they arrive ----------------------------------------


def _form(parts: list[tuple[str, str | None, bytes]], boundary: str) -> bytes:
    """A multipart/form-data body of (name, filename, content) parts."""
    out = []
    for name, filename, content in parts:
        disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        out.append(f"--{boundary}\r\nContent-Disposition: {disposition}\r\n\r\n".encode())
        out.append(content + b"\r\n")
    out.append(f"--{boundary}--\r\n".encode())
    return b"".join(out)


def _tiny_parts(size: int, boundary: str) -> bytes:
    part = f'--{boundary}\r\nContent-Disposition: form-data; name="x"\r\n\r\nx\r\n'.encode()
    return part * (size // len(part)) + f"--{boundary}--\r\n".encode()


def _nested_form(depth: int) -> tuple[bytes, str]:
    """A form whose file part is a form, whose part is a form, ... `depth` deep."""
    body = b"x"
    for level in range(depth):
        inner = f"content-type: multipart/mixed; boundary=b{level - 1}\r\n" if level else ""
        body = (
            (
                f'--b{level}\r\nContent-Disposition: form-data; name="file"; filename="f"\r\n'
                f"{inner}\r\n"
            ).encode()
            + body
            + f"\r\n--b{level}--\r\n".encode()
        )
    return body, f"multipart/form-data; boundary=b{depth - 1}"


class HealthzWatch:
    """/healthz of the router asked back to back from a thread, its slowest answer kept."""

    def __init__(self, server: RunningServer) -> None:
        self._server = server
        self._stop = threading.Event()
        self._first = threading.Event()
        self.slowest = 0.0
        self.samples = 0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with self._server.client(timeout=30) as http:
            while not self._stop.is_set():
                started = time.perf_counter()
                http.get("/healthz").raise_for_status()
                self.slowest = max(self.slowest, time.perf_counter() - started)
                self.samples += 1
                self._first.set()

    def __enter__(self) -> HealthzWatch:
        self._thread.start()
        assert self._first.wait(30), "/healthz never answered"
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(60)


def _flooded(server: RunningServer, send) -> tuple[httpx.Response, HealthzWatch]:
    with HealthzWatch(server) as watch:
        answer = send()
    return answer, watch


def test_a_flood_of_tiny_parts_to_e2b_leaves_healthz_answering(
    server: RunningServer, boxes: Sandboxes
) -> None:
    body = _tiny_parts(2 * 1_048_576, "flood")
    with _envd(server, boxes) as envd:
        answer, watch = _flooded(
            server,
            lambda: envd.post(
                "/files",
                content=body,
                params={"path": "/home/user/flood"},
                headers={"content-type": "multipart/form-data; boundary=flood"},
            ),
        )
    assert answer.status_code == 400, answer.text
    assert "parts" in answer.json()["message"] and answer.json()["code"] == 400
    assert watch.slowest < HEALTHZ_BOUND_S, (watch.slowest, watch.samples)


def test_a_flood_of_tiny_parts_to_picod_leaves_healthz_answering(
    server: RunningServer, boxes: Sandboxes
) -> None:
    body = _tiny_parts(2 * 1_048_576, "flood")
    with _picod(server, boxes) as picod:
        answer, watch = _flooded(
            server,
            lambda: picod.post(
                "/files",
                content=body,
                headers={"content-type": "multipart/form-data; boundary=flood"},
            ),
        )
    _spec_400(answer)
    assert "parts" in answer.json()["error"]["message"]
    assert watch.slowest < HEALTHZ_BOUND_S, (watch.slowest, watch.samples)


def test_a_form_nested_3000_deep_is_a_400_on_both_facades(
    server: RunningServer, boxes: Sandboxes
) -> None:
    body, content_type = _nested_form(3_000)
    headers = {"content-type": content_type}
    with _envd(server, boxes) as envd:
        answer = envd.post("/files", content=body, params={"path": "/home/user/n"}, headers=headers)
        assert answer.status_code == 400 and answer.json()["code"] == 400, answer.text
    picod_body = _form([("path", None, b"nested")], "outer")
    picod_body = picod_body.removesuffix(b"--outer--\r\n") + (
        b'--outer\r\nContent-Disposition: form-data; name="file"; filename="f"\r\n'
        + f"Content-Type: {content_type}\r\n\r\n".encode()
        + body
        + b"\r\n--outer--\r\n"
    )
    with _picod(server, boxes) as picod:
        answer = picod.post(
            "/files",
            content=picod_body,
            headers={"content-type": "multipart/form-data; boundary=outer"},
        )
    _spec_400(answer)


def test_an_e2b_form_larger_than_memory_bound_streams_through(
    server: RunningServer, boxes: Sandboxes
) -> None:
    """A form was read whole (and refused past 32 MiB); now each file streams on as sent,
    the way a raw upload always did, so a 40 MiB form of two files is written whole."""
    big = uuid.uuid4().bytes * ((MAX_UPLOAD + 8 * 1_048_576) // 16)
    body = _form([("file", "/home/user/big", big), ("file", "/home/user/small", b"hi")], "bnd")

    def chunks() -> Iterator[bytes]:  # sent chunked, as a streaming client would
        for start in range(0, len(body), 1_048_576):
            yield body[start : start + 1_048_576]

    with _envd(server, boxes) as envd:
        answer = envd.post(
            "/files",
            content=chunks(),
            headers={"content-type": "multipart/form-data; boundary=bnd"},
        )
        assert answer.status_code == 200, answer.text
        assert [entry["path"] for entry in answer.json()] == ["/home/user/big", "/home/user/small"]
        got = envd.get("/files", params={"path": "/home/user/big"})
        assert got.status_code == 200 and got.content == big
        assert envd.get("/files", params={"path": "/home/user/small"}).content == b"hi"


def test_a_picod_form_with_its_file_before_its_path_is_written(
    server: RunningServer, boxes: Sandboxes
) -> None:
    """requests sends `path` first; curl -F sends fields in the order given: both work."""
    with _picod(server, boxes) as picod:
        for name, order in (("first", ["path", "file"]), ("second", ["file", "path"])):
            content = {"path": (None, f"{name}.txt".encode()), "file": ("x", name.encode())}
            body = _form([(field, *content[field]) for field in order], "bnd")
            answer = picod.post(
                "/files",
                content=body,
                headers={"content-type": "multipart/form-data; boundary=bnd"},
            )
            assert answer.status_code == 200, answer.text
            assert answer.json()["size"] == len(name)
            assert picod.get(f"/files/{name}.txt").content == name.encode()
        missing = _form([("file", "x", b"data")], "bnd")
        answer = picod.post(
            "/files", content=missing, headers={"content-type": "multipart/form-data; boundary=bnd"}
        )
        _spec_400(answer)


@pytest.mark.parametrize(
    "body",
    [
        b"no boundary here",
        b'--bnd\r\nContent-Disposition: form-data; name="file"; filename="f"\r\n\r\ncut',
        b"--bnd\r\n" + b"X-Long: " + b"a" * 10_000 + b"\r\n\r\nx\r\n--bnd--\r\n",
        b"--bnd\r\n" + b"".join(b"X-%d: a\r\n" % i for i in range(50)) + b"\r\nx\r\n--bnd--\r\n",
    ],
    ids=["not-a-form", "cut-short", "long-header", "many-headers"],
)
def test_malformed_forms_are_a_400_on_both_facades(
    server: RunningServer, boxes: Sandboxes, body: bytes
) -> None:
    headers = {"content-type": "multipart/form-data; boundary=bnd"}
    with _envd(server, boxes) as envd:
        answer = envd.post("/files", content=body, params={"path": "/home/user/m"}, headers=headers)
        assert answer.status_code == 400 and answer.json()["code"] == 400, answer.text
    with _picod(server, boxes) as picod:
        _spec_400(picod.post("/files", content=body, headers=headers))
    with _envd(server, boxes) as envd:
        no_boundary = {"content-type": "multipart/form-data"}
        answer = envd.post(
            "/files", content=body, params={"path": "/home/user/m"}, headers=no_boundary
        )
        assert answer.status_code == 400, answer.text
