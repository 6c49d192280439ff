"""The files API (SPEC §2.4): operations, and every way out of the workspace refused."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import pytest

from sandcell.cellapi.client import DaemonClient
from support.daemons import RunningDaemon


@pytest.fixture
def base(daemon: RunningDaemon) -> str:
    """A fresh directory per test inside the shared workspace."""
    name = f"t-{secrets.token_hex(4)}"
    (daemon.workspace / name).mkdir()
    return name


@pytest.fixture(scope="module")
def outside(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("outside")
    (d / "secret.txt").write_text("host secret")
    return d


def _put(c: DaemonClient, path: str, data: bytes):
    return c.signed_request("PUT", "/v1/files", params={"path": path}, content=data)


def _get(c: DaemonClient, path: str):
    return c.signed_request("GET", "/v1/files", params={"path": path})


def test_write_read_stat_list(client, daemon, base):
    r = _put(client, f"{base}/deep/er/a.txt", b"hello")
    assert r.status_code == 200
    entry = r.json()
    assert entry["path"] == f"{base}/deep/er/a.txt" and entry["name"] == "a.txt"
    assert entry["type"] == "file" and entry["size"] == 5 and entry["mode"] == "0644"
    assert entry["modified"].endswith("Z")
    assert _get(client, f"{base}/deep/er/a.txt").content == b"hello"
    assert _put(client, f"{base}/empty", b"").json()["size"] == 0
    listing = client.signed_request("GET", "/v1/files/list", params={"path": base, "depth": 3})
    paths = [e["path"] for e in listing.json()["entries"]]
    assert paths == [f"{base}/deep", f"{base}/deep/er", f"{base}/deep/er/a.txt", f"{base}/empty"]
    shallow = client.signed_request("GET", "/v1/files/list", params={"path": base})
    assert [e["name"] for e in shallow.json()["entries"]] == ["deep", "empty"]
    st = client.signed_request("GET", "/v1/files/stat", params={"path": f"{base}/deep"})
    assert st.json()["type"] == "dir"
    # Absolute paths inside the workspace are accepted.
    absolute = f"{daemon.workspace}/{base}/deep/er/a.txt"
    assert _get(client, absolute).content == b"hello"


def test_overwrite_is_atomic_replace(client, daemon, base):
    _put(client, f"{base}/f", b"one")
    _put(client, f"{base}/f", b"two")
    assert (daemon.workspace / base / "f").read_bytes() == b"two"
    assert [p.name for p in (daemon.workspace / base).iterdir()] == ["f"]  # no temp left


def test_mkdir_move_delete(client, daemon, base):
    r = client.signed_request("POST", "/v1/files/mkdir", json_body={"path": f"{base}/x/y"})
    assert r.status_code == 200 and r.json()["type"] == "dir"
    no_parents = client.signed_request(
        "POST", "/v1/files/mkdir", json_body={"path": f"{base}/p/q", "parents": False}
    )
    assert no_parents.status_code == 404
    again = client.signed_request(
        "POST", "/v1/files/mkdir", json_body={"path": f"{base}/x", "parents": False}
    )
    assert again.status_code == 409 and again.json()["error"]["code"] == "CONFLICT"
    _put(client, f"{base}/a", b"A")
    _put(client, f"{base}/b", b"B")
    conflict = client.signed_request(
        "POST", "/v1/files/move", json_body={"from": f"{base}/a", "to": f"{base}/b"}
    )
    assert conflict.status_code == 409
    moved = client.signed_request(
        "POST",
        "/v1/files/move",
        json_body={"from": f"{base}/a", "to": f"{base}/b", "overwrite": True},
    )
    assert moved.status_code == 200 and moved.json()["path"] == f"{base}/b"
    assert (daemon.workspace / base / "b").read_bytes() == b"A"
    not_empty = client.signed_request("DELETE", "/v1/files", params={"path": f"{base}/x"})
    assert not_empty.status_code == 409
    gone = client.signed_request(
        "DELETE", "/v1/files", params={"path": f"{base}/x", "recursive": "true"}
    )
    assert gone.status_code == 204 and not (daemon.workspace / base / "x").exists()
    missing = client.signed_request("DELETE", "/v1/files", params={"path": f"{base}/x"})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "FILE_NOT_FOUND"


def test_upload_past_quota_is_413_and_leaves_nothing(client, daemon, base):
    quota = 8 * 1024 * 1024  # the fixture's --disk-quota-mb 8
    r = _put(client, f"{base}/big", b"x" * (quota + 1))
    assert r.status_code == 413 and r.json()["error"]["code"] == "PAYLOAD_TOO_LARGE"
    assert list((daemon.workspace / base).iterdir()) == []


@pytest.mark.parametrize(
    "path", ["../escape.txt", "a/../../escape.txt", "/etc/passwd", "/tmp/x", "..", "/"]
)
def test_paths_outside_forbidden(client, path):
    for response in (
        _get(client, path),
        _put(client, path, b"x"),
        client.signed_request("GET", "/v1/files/stat", params={"path": path}),
        client.signed_request("DELETE", "/v1/files", params={"path": path}),
        client.signed_request("POST", "/v1/files/mkdir", json_body={"path": path}),
    ):
        assert response.status_code == 403, (path, response.status_code, response.text)
        assert response.json()["error"]["code"] == "FORBIDDEN"


def test_planted_symlink_to_outside(client, daemon, base, outside):
    link = daemon.workspace / base / "link"
    link.symlink_to(outside / "secret.txt")
    assert _get(client, f"{base}/link").status_code == 403
    assert _put(client, f"{base}/link", b"overwrite").status_code == 403
    assert (outside / "secret.txt").read_text() == "host secret"
    # stat and delete act on the link itself, never on its target.
    st = client.signed_request("GET", "/v1/files/stat", params={"path": f"{base}/link"})
    assert st.json()["type"] == "symlink"
    rm = client.signed_request("DELETE", "/v1/files", params={"path": f"{base}/link"})
    assert rm.status_code == 204 and (outside / "secret.txt").exists()


def test_symlinked_parent_directory(client, daemon, base, outside):
    (daemon.workspace / base / "dirlink").symlink_to(outside)
    relative_escape = daemon.workspace / base / "rel"
    relative_escape.symlink_to("../../../")
    for prefix in ("dirlink", "rel"):
        assert _get(client, f"{base}/{prefix}/secret.txt").status_code == 403
        assert _put(client, f"{base}/{prefix}/new.txt", b"x").status_code == 403
        listing = client.signed_request(
            "GET", "/v1/files/list", params={"path": f"{base}/{prefix}"}
        )
        assert listing.status_code == 403
        mk = client.signed_request(
            "POST", "/v1/files/mkdir", json_body={"path": f"{base}/{prefix}/d"}
        )
        assert mk.status_code == 403
        mv = client.signed_request(
            "POST", "/v1/files/move", json_body={"from": f"{base}/{prefix}/secret.txt", "to": "s"}
        )
        assert mv.status_code == 403
        rm = client.signed_request(
            "DELETE", "/v1/files", params={"path": f"{base}/{prefix}/secret.txt"}
        )
        assert rm.status_code == 403
    assert not (outside / "new.txt").exists() and (outside / "secret.txt").exists()
    assert not (outside / "d").exists()


def test_recursive_delete_does_not_follow_links(client, daemon, base, outside):
    tree = daemon.workspace / base / "tree"
    tree.mkdir()
    (tree / "out").symlink_to(outside)
    r = client.signed_request(
        "DELETE", "/v1/files", params={"path": f"{base}/tree", "recursive": "true"}
    )
    assert r.status_code == 204
    assert (outside / "secret.txt").read_text() == "host secret"


def test_symlink_inside_workspace_is_followed(client, daemon, base):
    (daemon.workspace / base / "real.txt").write_text("inside")
    (daemon.workspace / base / "alias").symlink_to("real.txt")
    assert _get(client, f"{base}/alias").content == b"inside"


def test_symlink_swapped_in_during_uploads(client, daemon, base, outside):
    """A racer flips a directory into a symlink out while uploads go on: none escapes."""
    import threading

    target = daemon.workspace / base / "flip"
    stop = threading.Event()

    def flipper() -> None:
        while not stop.is_set():
            try:
                target.mkdir()
                target.rmdir()
                target.symlink_to(outside)
                target.unlink()
            except OSError:
                pass

    thread = threading.Thread(target=flipper)
    thread.start()
    try:
        for i in range(150):
            _put(client, f"{base}/flip/race-{i}.txt", b"x")
    finally:
        stop.set()
        thread.join()
    assert not [p for p in outside.iterdir() if p.name.startswith("race-")]


def test_errors_for_wrong_types(client, base):
    _put(client, f"{base}/file", b"x")
    r = client.signed_request("GET", "/v1/files/list", params={"path": f"{base}/file"})
    assert r.status_code == 400
    r = _get(client, base)
    assert r.status_code == 400
    for depth in ("0", "\u00b3"):  # a superscript digit passes str.isdigit(), not int()
        r = client.signed_request("GET", "/v1/files/list", params={"path": base, "depth": depth})
        assert r.status_code == 400
    r = client.signed_request("GET", "/v1/files", params={})
    assert r.status_code == 400


def test_files_created_with_sane_modes(client, daemon, base):
    _put(client, f"{base}/m/f", b"x")
    assert oct(os.stat(daemon.workspace / base / "m").st_mode & 0o777) == "0o755"


def test_entries_carry_owner_target_and_user_metadata(client, daemon, base):
    import json

    meta = {"e2b.owner": "agent-7", "note": "x y"}
    r = client.signed_request(
        "PUT",
        "/v1/files",
        params={"path": f"{base}/m.txt", "metadata": json.dumps(meta)},
        content=b"abc",
    )
    assert r.status_code == 200, r.text
    entry = r.json()
    assert entry["metadata"] == meta
    st = os.stat(daemon.workspace / base / "m.txt")
    assert (entry["uid"], entry["gid"]) == (st.st_uid, st.st_gid)
    assert entry["owner"] and entry["group"]
    assert entry["target"] is None
    # SPEC §2.4's fields unchanged.
    assert {k: entry[k] for k in ("name", "type", "size", "mode")} == {
        "name": "m.txt",
        "type": "file",
        "size": 3,
        "mode": "0644",
    }
    os.symlink("m.txt", daemon.workspace / base / "link")
    listing = client.signed_request("GET", "/v1/files/list", params={"path": base}).json()
    by_name = {e["name"]: e for e in listing["entries"]}
    assert by_name["link"]["type"] == "symlink" and by_name["link"]["target"] == "m.txt"
    assert by_name["m.txt"]["metadata"] == meta
    moved = client.signed_request(
        "POST", "/v1/files/move", json_body={"from": f"{base}/m.txt", "to": f"{base}/n.txt"}
    ).json()
    assert moved["metadata"] == meta
    bad = client.signed_request(
        "PUT", "/v1/files", params={"path": f"{base}/b", "metadata": "[1]"}, content=b""
    )
    assert bad.status_code == 400
    # SPEC §2.4: sandcell's own API still answers 404 for a missing path.
    gone = client.signed_request("DELETE", "/v1/files", params={"path": f"{base}/nope"})
    assert gone.status_code == 404


def test_a_filesystem_without_user_xattrs_is_named(monkeypatch, tmp_path):
    import errno

    from sandcell.daemon.files import operations
    from sandcell.errors import ServiceError

    def refuse(*_args):
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")

    monkeypatch.setattr(operations.os, "setxattr", refuse)
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT)
    try:
        with pytest.raises(ServiceError, match="does not support user xattrs") as exc:
            operations.set_metadata(fd, "f", {"k": "v"})
        assert exc.value.details == {"path": "f"}
    finally:
        os.close(fd)
