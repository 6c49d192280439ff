"""Pause and resume through a real `sandcell serve` and real cells (SPEC §13)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from sdk.helpers import stop_and_clean
from support.server import SMALL_TEMPLATE, RunningServer, start_server

pytestmark = pytest.mark.slow


CONFIG = SMALL_TEMPLATE.format(warm_pool=0) + "max_memory_mb = 384\nmax_cpus = 2.0\n"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    srv = start_server(tmp_path_factory.mktemp("persist") / "data", config_text=CONFIG)
    yield srv
    srv.stop()
    assert not list((srv.data_dir / "cells").iterdir()), "cells left after shutdown"


@pytest.fixture(scope="module")
def alice(server: RunningServer) -> str:
    return server.create_key("alice")


def _create(c: httpx.Client, **body) -> str:
    r = c.post("/v1/sandboxes", json=body)
    assert r.status_code == 201, r.text
    return r.json()["id"]


def _exec(c: httpx.Client, sandbox_id: str, command: str) -> httpx.Response:
    return c.post(f"/v1/sandboxes/{sandbox_id}/exec", json={"command": command})


def test_pause_then_a_request_resumes_it(server, alice):
    with server.client(alice) as c:
        sid = _create(c)
        _exec(c, sid, "echo kept > a.txt; sleep 600 >/dev/null 2>&1 &")
        paused = c.post(f"/v1/sandboxes/{sid}/pause")
        assert paused.status_code == 200 and paused.json()["state"] == "paused"
        assert paused.json()["paused_at"] is not None
        assert c.post(f"/v1/sandboxes/{sid}/pause").json()["state"] == "paused"  # idempotent
        assert c.get(f"/v1/sandboxes/{sid}").json()["state"] == "paused"
        # auto_resume (the default): the next proxied request resumes it first.
        r = _exec(c, sid, "cat a.txt; pgrep -c sleep || true")
        assert r.status_code == 200 and r.json()["stdout"] == "kept\n0\n"
        assert c.get(f"/v1/sandboxes/{sid}").json()["state"] == "running"
        assert c.delete(f"/v1/sandboxes/{sid}").status_code == 204
        gone = c.post(f"/v1/sandboxes/{sid}/resume")
        assert gone.status_code == 404 and gone.json()["error"]["code"] == "SANDBOX_NOT_FOUND"
    assert not list((server.data_dir / "workspaces").iterdir())


def test_without_auto_resume_a_request_gets_409_until_resumed(server, alice):
    with server.client(alice) as c:
        sid = _create(c, auto_resume=False, metadata={"k": "v"}, env={"X": "1"})
        _exec(c, sid, "echo kept > a.txt")
        assert c.post(f"/v1/sandboxes/{sid}/pause").status_code == 200
        for refused in (_exec(c, sid, "cat a.txt"), c.post(f"/v1/sandboxes/{sid}/keepalive")):
            assert refused.status_code == 409
            assert refused.json()["error"]["code"] == "SANDBOX_PAUSED"
        assert c.get(f"/v1/sandboxes/{sid}").json()["state"] == "paused"
        resumed = c.post(f"/v1/sandboxes/{sid}/resume")
        assert resumed.status_code == 200 and resumed.json()["state"] == "running"
        assert resumed.json()["metadata"] == {"k": "v"}
        assert _exec(c, sid, "cat a.txt; echo $X").json()["stdout"] == "kept\n1\n"
        c.delete(f"/v1/sandboxes/{sid}")


@pytest.mark.parametrize("auto_resume", [True, False])
def test_a_websocket_to_a_paused_sandbox_wakes_it_or_is_refused(server, alice, auto_resume):
    with server.client(alice) as c:
        sid = _create(c, auto_resume=auto_resume)
        c.post(f"/v1/sandboxes/{sid}/pause")
        url = "ws" + server.url.removeprefix("http") + f"/v1/sandboxes/{sid}/processes/1/ws"
        with pytest.raises(InvalidStatus) as refused:  # no process 1 in the new cell either
            connect(url, additional_headers={"authorization": f"Bearer {alice}"}).close()
        assert refused.value.response.status_code == (404 if auto_resume else 409)
        state = c.get(f"/v1/sandboxes/{sid}").json()["state"]
        assert state == ("running" if auto_resume else "paused")
        c.delete(f"/v1/sandboxes/{sid}")


def test_another_principal_cannot_pause_or_resume(server, alice):
    bob = server.create_key("bob-persist")
    with server.client(alice) as c, server.client(bob) as other:
        sid = _create(c)
        for verb in ("pause", "resume"):
            r = other.post(f"/v1/sandboxes/{sid}/{verb}")
            assert r.status_code == 404 and r.json()["error"]["code"] == "SANDBOX_NOT_FOUND"
        assert c.get(f"/v1/sandboxes/{sid}").json()["state"] == "running"
        c.delete(f"/v1/sandboxes/{sid}")


def test_snapshot_start_from_it_fork_and_privacy(server, alice):
    bob = server.create_key("bob-snapshots")
    with server.client(alice) as c, server.client(bob) as other:
        sid = _create(c, metadata={"k": "v"})
        _exec(c, sid, "echo v1 > a.txt")
        made = c.post(f"/v1/sandboxes/{sid}/snapshots", json={"name": "first"})
        assert made.status_code == 201, made.text
        snap = made.json()
        assert snap["id"].startswith("snap-") and snap["sandbox_id"] == sid
        assert snap["name"] == "first" and snap["template"] == "default" and snap["size_bytes"] > 0
        _exec(c, sid, "echo v2 > a.txt")
        from_snap = _create(c, snapshot=snap["id"])
        assert _exec(c, from_snap, "cat a.txt").json()["stdout"] == "v1\n"
        forked = c.post(f"/v1/sandboxes/{sid}/fork")
        assert forked.status_code == 201 and forked.json()["metadata"] == {"k": "v"}
        assert _exec(c, forked.json()["id"], "cat a.txt").json()["stdout"] == "v2\n"
        assert [s["id"] for s in c.get("/v1/snapshots").json()["snapshots"]] == [snap["id"]]
        # Another principal: nothing listed, 404 to delete or start from it.
        assert other.get("/v1/snapshots").json() == {"snapshots": []}
        assert other.delete(f"/v1/snapshots/{snap['id']}").status_code == 404
        stolen = other.post("/v1/sandboxes", json={"snapshot": snap["id"]})
        assert stolen.status_code == 404 and stolen.json()["error"]["code"] == "NOT_FOUND"
        assert c.post("/v1/sandboxes", json={"snapshot": "nope"}).status_code == 400
        assert c.delete(f"/v1/snapshots/{snap['id']}").status_code == 204
        assert c.delete(f"/v1/snapshots/{snap['id']}").status_code == 404
        for each in (sid, from_snap, forked.json()["id"]):
            assert c.delete(f"/v1/sandboxes/{each}").status_code == 204
    assert not list((server.data_dir / "snapshots").iterdir())


def test_resources_show_in_the_sandbox_metrics(server, alice):
    with server.client(alice) as c:
        over = c.post("/v1/sandboxes", json={"resources": {"memory_mb": 4096}})
        assert over.status_code == 400 and over.json()["error"]["code"] == "BAD_REQUEST"
        bad = c.post("/v1/sandboxes", json={"resources": {"gpus": 1}})
        assert bad.status_code == 400
        sid = _create(c, resources={"memory_mb": 300, "cpus": 1.5})
        metrics = c.get(f"/v1/sandboxes/{sid}/metrics").json()
        assert metrics["memory_limit_bytes"] == 300 * 1024**2 and metrics["cpus"] == 1.5
        assert metrics["disk_limit_bytes"] == 128 * 1024**2  # the template's: not asked for
        c.delete(f"/v1/sandboxes/{sid}")


@contextlib.contextmanager
def _alone(tmp_path: Path, server_setting: str) -> Iterator[httpx.Client]:
    """A client of a server of its own with one `[server]` setting; all of it goes after."""
    config = f"[server]\n{server_setting}\n" + SMALL_TEMPLATE.format(warm_pool=0)
    srv = start_server(tmp_path / "data", config_text=config)
    try:
        with srv.client(srv.create_key("alice")) as c:
            yield c
    finally:
        stop_and_clean(srv)


def test_paused_sandboxes_hold_no_slot_and_a_resume_needs_one(tmp_path):
    with _alone(tmp_path, "max_sandboxes_per_key = 1") as c:
        first = _create(c)
        assert c.post("/v1/sandboxes", json={}).status_code == 429
        assert c.post(f"/v1/sandboxes/{first}/pause").status_code == 200
        second = _create(c)  # the paused one holds no slot
        full = c.post(f"/v1/sandboxes/{first}/resume")
        assert full.status_code == 429 and full.json()["error"]["code"] == "RATE_LIMITED"
        assert _exec(c, first, "true").status_code == 429  # nor does auto-resume pass
        assert c.get(f"/v1/sandboxes/{first}").json()["state"] == "paused"
        c.delete(f"/v1/sandboxes/{second}")
        assert c.post(f"/v1/sandboxes/{first}/resume").json()["state"] == "running"
        c.delete(f"/v1/sandboxes/{first}")


def test_a_snapshot_over_quota_is_413(tmp_path):
    with _alone(tmp_path, "snapshot_quota_mb = 1") as c:
        sid = _create(c)
        _exec(c, sid, "head -c 3000000 /dev/urandom > big")
        r = c.post(f"/v1/sandboxes/{sid}/snapshots")
        assert r.status_code == 413 and r.json()["error"]["code"] == "PAYLOAD_TOO_LARGE"
        assert c.get("/v1/snapshots").json() == {"snapshots": []}
        c.delete(f"/v1/sandboxes/{sid}")


@pytest.mark.parametrize("verb", ["pause", "resume", "snapshots"])
@pytest.mark.parametrize("after_s", [0.0, 0.05, 0.2])
def test_sigkill_mid_move_leaves_one_consistent_sandbox(tmp_path, verb, after_s):
    """The server killed at some point of a pause, resume or snapshot: after a restart the
    sandbox is paused or running (never both, never neither), its files are all there, and
    no half snapshot is listed or left."""
    data = tmp_path / "data"
    first = start_server(data, config_text=SMALL_TEMPLATE.format(warm_pool=0))
    key = first.create_key("alice")
    with first.client(key) as c:
        sid = _create(c)
        _exec(c, sid, "head -c 20000000 /dev/urandom > big; echo kept > a.txt")
        if verb == "resume":
            assert c.post(f"/v1/sandboxes/{sid}/pause").status_code == 200
    mover = threading.Thread(target=_post_ignoring_errors, args=(first, key, f"{sid}/{verb}"))
    mover.start()
    time.sleep(after_s)
    first.stop(sig=9)
    mover.join()
    second = start_server(data, config_text=SMALL_TEMPLATE.format(warm_pool=0))
    try:
        with second.client(key) as c:
            state = c.get(f"/v1/sandboxes/{sid}").json()["state"]
            assert state in ("paused", "running")
            cells = list((data / "cells").iterdir())
            homes = list((data / "workspaces").glob(sid)) if (data / "workspaces").exists() else []
            assert (len(cells), len(homes)) == ((1, 0) if state == "running" else (0, 1))
            r = _exec(c, sid, "cat a.txt; stat -c %s big")
            assert r.json()["stdout"] == "kept\n20000000\n"
            listed = c.get("/v1/snapshots").json()["snapshots"]
            on_disk = list((data / "snapshots").iterdir()) if (data / "snapshots").exists() else []
            assert [s["id"] for s in listed] == [p.name for p in on_disk]
            for snap in listed:
                assert snap["size_bytes"] > 20_000_000
                c.delete(f"/v1/snapshots/{snap['id']}")
            assert c.delete(f"/v1/sandboxes/{sid}").status_code == 204
    finally:
        second.stop()
    assert not list((data / "cells").iterdir())


def _post_ignoring_errors(server: RunningServer, key: str, path: str) -> None:
    try:
        with server.client(key) as c:
            c.post(f"/v1/sandboxes/{path}")
    except httpx.HTTPError:
        pass  # the server was killed under it
