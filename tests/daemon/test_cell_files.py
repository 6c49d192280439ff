"""The cell-wide file table (`/cell/files`, SPEC §14.2): the workspace and the cell's /tmp,
each confined as §2.4 confines the workspace; `/v1/files` still reaches the workspace alone.

The daemon here runs on the host, so its /tmp is the host's: every test works in its own
`tmp_path` beneath it, and attacks aim at what lies outside /tmp (/etc, /proc, the root).
Started without `--in-cell`, as everywhere but a cell's launcher, it refuses `/`: only inside
a cell is the root its cell's own, read then (tests/compat/e2b/test_cell_root.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandcell.cellapi.client import DaemonClient
from support.daemons import RunningDaemon


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    if not str(tmp_path.resolve()).startswith("/tmp/"):
        pytest.skip("the test's directory is not beneath /tmp")
    return tmp_path.resolve()


def _put(c: DaemonClient, base: str, path: str, data: bytes):
    return c.signed_request("PUT", base, params={"path": path}, content=data)


def _calls(c: DaemonClient, base: str, path: str):
    return (
        c.signed_request("GET", base, params={"path": path}),
        _put(c, base, path, b"x"),
        c.signed_request("GET", f"{base}/stat", params={"path": path}),
        c.signed_request("GET", f"{base}/list", params={"path": path}),
        c.signed_request("DELETE", base, params={"path": path, "recursive": "true"}),
        c.signed_request("POST", f"{base}/mkdir", json_body={"path": f"{path}/d"}),
    )


def test_tmp_files_through_the_cell_table(client: DaemonClient, scratch: Path) -> None:
    put = _put(client, "/cell/files", f"{scratch}/a/b.txt", b"hello")
    assert put.status_code == 200, put.text
    assert put.json()["path"] == f"{scratch}/a/b.txt"  # absolute: not the workspace's
    assert (scratch / "a" / "b.txt").read_bytes() == b"hello"
    got = client.signed_request("GET", "/cell/files", params={"path": f"{scratch}/a/b.txt"})
    assert got.content == b"hello"
    listed = client.signed_request(
        "GET", "/cell/files/list", params={"path": str(scratch), "depth": 2}
    )
    assert [e["path"] for e in listed.json()["entries"]] == [f"{scratch}/a", f"{scratch}/a/b.txt"]
    moved = client.signed_request(
        "POST",
        "/cell/files/move",
        json_body={"from": f"{scratch}/a/b.txt", "to": f"{scratch}/c.txt"},
    )
    assert moved.json()["path"] == f"{scratch}/c.txt"
    gone = client.signed_request("DELETE", "/cell/files", params={"path": f"{scratch}/c.txt"})
    assert gone.status_code == 204 and not (scratch / "c.txt").exists()


def test_the_workspace_is_the_same_in_both_tables(
    client: DaemonClient, daemon: RunningDaemon, scratch: Path
) -> None:
    name = f"both-{scratch.name}"
    assert _put(client, "/cell/files", f"{name}/f", b"ws").json()["path"] == f"{name}/f"
    got = client.signed_request("GET", "/v1/files", params={"path": f"{name}/f"})
    assert got.content == b"ws" and (daemon.workspace / name / "f").read_bytes() == b"ws"


def test_v1_never_reaches_tmp(client: DaemonClient, scratch: Path) -> None:
    (scratch / "kept").write_text("scratch")
    for response in _calls(client, "/v1/files", f"{scratch}/kept"):
        assert response.status_code == 403, response.text
    assert (scratch / "kept").read_text() == "scratch"


def test_a_move_cannot_cross_places(client: DaemonClient, scratch: Path) -> None:
    (scratch / "m").write_text("m")
    moved = client.signed_request(
        "POST", "/cell/files/move", json_body={"from": f"{scratch}/m", "to": "m"}
    )
    assert moved.status_code == 400 and "a move stays within /tmp" in moved.text
    assert (scratch / "m").read_text() == "m"


@pytest.mark.parametrize("tail", ["etc/passwd", "etc", "proc/1/root", "x/../../etc/passwd"])
def test_dot_segments_out_of_tmp(client: DaemonClient, scratch: Path, tail: str) -> None:
    up = "../" * len(scratch.relative_to("/tmp").parts)
    for response in _calls(client, "/cell/files", f"{scratch}/{up}../{tail}"):
        assert response.status_code == 403, (tail, response.status_code, response.text)
    for path in ("/tmp/../etc/passwd", "//etc/passwd", "/etc/passwd", "/"):
        for response in _calls(client, "/cell/files", path):
            assert response.status_code == 403, (path, response.status_code, response.text)


@pytest.mark.parametrize("target", ["/etc", "/", "/proc/self/root", "/proc/1/cwd", "up-to-etc"])
def test_symlinks_in_tmp_lead_nowhere(client: DaemonClient, scratch: Path, target: str) -> None:
    if target == "up-to-etc":  # relative, one `..` past /tmp
        target = "../" * len(scratch.relative_to("/tmp").parts) + "../etc"
    link = scratch / "link"
    link.symlink_to(target)
    for response in _calls(client, "/cell/files", f"{link}/passwd"):
        assert response.status_code == 403, (target, response.status_code, response.text)
        assert "outside /tmp" in response.json()["error"]["message"]
    listed = client.signed_request("GET", "/cell/files/list", params={"path": str(link)})
    assert listed.status_code == 403
    assert _put(client, "/cell/files", str(link), b"not through the link").status_code == 403
    assert os.readlink(link) == target  # the link is as it was, and so is what it names
    stat = client.signed_request("GET", "/cell/files/stat", params={"path": str(link)})
    assert stat.json()["type"] == "symlink" and stat.json()["target"] == target
    removed = client.signed_request("DELETE", "/cell/files", params={"path": str(link)})
    assert removed.status_code == 204 and not link.is_symlink()


def test_a_link_swapped_in_under_a_directory(client: DaemonClient, scratch: Path) -> None:
    """A directory replaced by a link to /etc between calls: the next call refuses it."""
    (scratch / "d").mkdir()
    assert _put(client, "/cell/files", f"{scratch}/d/f", b"1").status_code == 200
    (scratch / "d" / "f").unlink()
    (scratch / "d").rmdir()
    (scratch / "d").symlink_to("/etc")
    assert _put(client, "/cell/files", f"{scratch}/d/hostname", b"x").status_code == 403
    got = client.signed_request("GET", "/cell/files", params={"path": f"{scratch}/d/hostname"})
    assert got.status_code == 403
