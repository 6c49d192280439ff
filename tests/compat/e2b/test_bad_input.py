"""Malformed calls to the façade get E2B-shaped 4xx answers, never a 500."""

from __future__ import annotations

import zlib

import httpx
import pytest
from e2b import Sandbox

from sandcell.compat.e2b.files import MAX_UPLOAD
from support.server import RunningServer

pytestmark = pytest.mark.slow


def _envd(server: RunningServer, sbx: Sandbox) -> httpx.Client:
    headers = {
        "E2b-Sandbox-Id": sbx.sandbox_id,
        "E2b-Sandbox-Port": "49983",
        "X-Access-Token": sbx._envd_access_token or "",
    }
    return httpx.Client(base_url=f"{server.url}/e2b", headers=headers, timeout=30)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/filesystem.Filesystem/Stat", b"not json"),
        ("/filesystem.Filesystem/Stat", b'{"path": 5}'),
        ("/filesystem.Filesystem/Stat", b'{"path": "/proc/self/environ"}'),
        ("/filesystem.Filesystem/ListDir", b'{"path": "/home/user", "depth": "deep"}'),
        ("/filesystem.Filesystem/Move", b'{"source": ["a"], "destination": "b"}'),
        ("/process.Process/SendSignal", b'{"process": {"pid": "x"}, "signal": "SIGNAL_SIGKILL"}'),
        ("/process.Process/SendSignal", b'{"process": {"pid": 1}, "signal": [1]}'),
        ("/process.Process/SendInput", b'{"process": 7, "input": {"stdin": "!!"}}'),
        ("/process.Process/Update", b'{"process": {"pid": 1}, "pty": {"size": {"cols": "w"}}}'),
        ("/process.Process/Nope", b"{}"),
    ],
)
def test_bad_unary_calls(e2b_server: RunningServer, sbx: Sandbox, path: str, body: bytes) -> None:
    with _envd(e2b_server, sbx) as client:
        answer = client.post(path, content=body, headers={"content-type": "application/json"})
    assert 400 <= answer.status_code < 500 or answer.status_code == 501, answer.text
    assert isinstance(answer.json()["code"], str) and answer.json()["message"]


def _gzip_of_zeros(size: int) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    chunk = bytes(1 << 20)
    return b"".join(packer.compress(chunk) for _ in range(size >> 20)) + packer.flush()


def test_gzip_uploads_are_bounded(e2b_server: RunningServer, sbx: Sandbox) -> None:
    """A gzip bomb is refused at the upload limit, never inflated whole; junk is a 400."""
    bomb = _gzip_of_zeros(MAX_UPLOAD + (1 << 20))
    headers = {"content-type": "application/octet-stream", "content-encoding": "gzip"}
    with _envd(e2b_server, sbx) as client:
        params = {"path": "/home/user/bomb"}
        assert (
            client.post("/files", content=bomb, params=params, headers=headers).status_code == 413
        )
        junk = client.post("/files", content=b"not gzip", params=params, headers=headers)
        assert junk.status_code == 400
    assert not sbx.files.exists("/home/user/bomb")


def test_files_route_methods(e2b_server: RunningServer, sbx: Sandbox) -> None:
    with _envd(e2b_server, sbx) as client:
        answer = client.delete("/files", params={"path": "/home/user/x"})
        assert answer.status_code == 405
        assert answer.json()["code"] == 405
        assert client.get("/files").status_code in (400, 404)  # the workspace itself: a dir


@pytest.mark.parametrize(
    "message",
    [
        b"\x00\x00\x00\x00\x02{}",  # no cmd
        b'\x00\x00\x00\x00\x1d{"process": {"cmd": ["ls"]}}',
        b'\x00\x00\x00\x00\x2a{"process": {"cmd": "ls", "args": "-la"}} ',
        b"\x00\x00\x00",
    ],
)
def test_bad_streams_end_with_an_error(
    e2b_server: RunningServer, sbx: Sandbox, message: bytes
) -> None:
    with _envd(e2b_server, sbx) as client:
        answer = client.post(
            "/process.Process/Start",
            content=message,
            headers={"content-type": "application/connect+json"},
        )
    assert answer.status_code == 200
    assert answer.content[0] == 0x02
    assert b'"invalid_argument"' in answer.content


def test_bad_control_calls(e2b_server: RunningServer, e2b_env: dict[str, str]) -> None:
    headers = {"X-API-KEY": e2b_env["E2B_API_KEY"]}
    with httpx.Client(base_url=f"{e2b_server.url}/e2b", headers=headers, timeout=30) as client:
        for body in (b"[]", b"{", b'{"timeout": "soon"}', b'{"templateID": 3}'):
            answer = client.post("/sandboxes", content=body)
            assert answer.status_code == 400, answer.text
            assert answer.json()["code"] == 400
        assert client.post("/sandboxes", json={"templateID": "no-such"}).status_code in (400, 404)
        assert client.get("/sandboxes/a/b/c").json() == {
            "code": 404,
            "message": "GET /sandboxes/a/b/c is not served",
        }


def test_pause_keeps_files_and_connect_resumes(sbx: Sandbox) -> None:
    """E2B's pause maps onto sandcell's (files kept, memory not); connect resumes it."""
    sbx.files.write("/home/user/kept.txt", "still here")
    assert sbx.pause() is True
    assert not sbx.is_running()
    assert sbx.pause() is False  # E2B's "already paused"
    again = Sandbox.connect(sbx.sandbox_id)
    assert again.is_running()
    assert again.files.read("/home/user/kept.txt") == "still here"
    assert again.commands.run("echo alive").stdout == "alive\n"


def test_metrics(sbx: Sandbox) -> None:
    metrics = sbx.get_metrics()  # the samples kept so far: one at least
    assert metrics and all(m.mem_total > 0 for m in metrics)
