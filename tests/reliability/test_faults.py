"""Faults inside one server: a daemon killed mid-exec, a full workspace, a flood of output."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from reliability.harness import (
    assert_error_shape,
    cell_of,
    code,
    rss_bytes,
    servers,
    wait_for,
)
from sandcell.isolation import cgroups
from support.cells import daemon_pids, kill_daemon
from support.server import RunningServer

MIB = 1024 * 1024
CONFIG = """
[server]
reap_interval_s = 1

[templates.default]
memory_mb = 256
pids_max = 128
disk_mb = 128
warm_pool = 0

[templates.tiny_disk]
memory_mb = 256
pids_max = 128
disk_mb = 32
warm_pool = 0
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with servers(tmp_path_factory.mktemp("faults")) as fleet:
        yield fleet.start("data", config_text=CONFIG)


@pytest.fixture(scope="module")
def key(server: RunningServer) -> str:
    return server.create_key("faults")


@pytest.fixture
def c(server: RunningServer, key: str) -> Iterator[httpx.Client]:
    with server.client(key, timeout=60) as client:
        yield client


def _create(c: httpx.Client, template: str = "default") -> str:
    r = c.post("/v1/sandboxes", json={"template": template})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def _exec(c: httpx.Client, sid: str, **body) -> dict:
    r = c.post(f"/v1/sandboxes/{sid}/exec", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def _cgroup(cell: str) -> cgroups.CellCgroup | None:
    return cgroups.detect("sandcell").open(f"cell-{cell}")


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :][:1] != b"Z"


# -- a daemon SIGKILLed in the middle of an exec ----------------------------------------------


@pytest.mark.parametrize("mode", ["buffered", "streamed"])
def test_daemon_sigkilled_mid_exec(server, key, c, mode, figures):
    """The caller learns fast (502, or a stream that ends without its exit line), the reaper
    deletes the sandbox, and nothing of the cell stays on the host."""
    sid = _create(c)
    cell = cell_of(server, c, sid)
    cg = _cgroup(cell)
    assert cg is not None
    outcome: dict = {}

    def call() -> None:
        body = {"command": "echo started; exec sleep 60", "timeout_s": 120}
        with server.client(key, timeout=30) as own:
            try:
                if mode == "buffered":
                    r = own.post(f"/v1/sandboxes/{sid}/exec", json=body)
                    outcome["status"], outcome["error"] = r.status_code, assert_error_shape(r)
                else:
                    headers = {"accept": "application/x-ndjson"}
                    lines = outcome.setdefault("lines", [])
                    with own.stream(
                        "POST", f"/v1/sandboxes/{sid}/exec", json=body, headers=headers
                    ) as r:
                        for line in r.iter_lines():
                            if line:
                                lines.append(json.loads(line))
            except httpx.HTTPError as exc:
                outcome["exception"] = exc
            outcome["ended"] = time.monotonic()

    caller = threading.Thread(target=call)
    caller.start()

    def sleeping() -> list[int]:
        return [p for p in cg.pids() if b"sleep" in Path(f"/proc/{p}/cmdline").read_bytes()]

    victims = wait_for(sleeping, 10, "the command to run")
    cell_pids = cg.pids()
    killed = time.monotonic()
    kill_daemon("sandcell", cell)
    caller.join(15)
    assert not caller.is_alive(), "the caller hangs after its daemon died"
    answered_s = outcome["ended"] - killed
    if mode == "buffered":
        assert outcome["status"] == 502 and outcome["error"]["code"] == "SANDBOX_UNREACHABLE"
    else:
        # Headers and the first line had gone out: the stream ends, without an exit line.
        assert outcome["lines"][:1] == [{"type": "stdout", "data": "started\n"}], outcome
        assert all(line["type"] != "exit" for line in outcome["lines"]), outcome
    assert answered_s < 3, f"the caller waited {answered_s:.1f} s"

    r = c.post(f"/v1/sandboxes/{sid}/exec", json={"command": "true"})
    assert r.status_code in (502, 404), r.text  # 404 once the reaper was there first
    started = time.monotonic()
    wait_for(lambda: c.get(f"/v1/sandboxes/{sid}").status_code == 404, 15, "the reaper")
    reaped_s = time.monotonic() - started + (started - killed)
    assert _cgroup(cell) is None, "the cell's cgroup is left"
    assert not (server.data_dir / "cells" / cell).exists(), "the cell's directory is left"
    assert f"/cells/{cell}/" not in Path("/proc/mounts").read_text(), "the workspace is mounted"
    survivors = [p for p in cell_pids | set(victims) if _alive(p)]
    assert survivors == [], f"processes of the cell survive: {survivors}"
    figures[f"fault: daemon SIGKILL mid-exec ({mode})"] = {
        "answer": outcome.get("status", "stream ended without exit line"),
        "answered_after_s": round(answered_s, 3),
        "reaped_after_s": round(reaped_s, 2),
        "left_on_host": 0,
    }


# -- a full workspace --------------------------------------------------------------------------


def test_disk_full_is_a_clear_error_and_the_daemon_survives(c, figures):
    sid = _create(c, "tiny_disk")
    base = f"/v1/sandboxes/{sid}"
    try:
        full = _exec(c, sid, command="head -c 48M /dev/zero > fill", timeout_s=60)
        assert full["exit_code"] != 0, full
        assert "No space left on device" in full["stderr"] or full["signal"] == 25, full
        assert _exec(c, sid, command="echo alive")["stdout"] == "alive\n"

        # An upload into the full disk: 413 with the path, and no temp file left behind.
        r = c.put(f"{base}/files", params={"path": "more.bin"}, content=b"x" * (4 * MIB))
        assert r.status_code == 413 and code(r) == "PAYLOAD_TOO_LARGE", r.text
        assert assert_error_shape(r)["details"]["path"] == "more.bin"
        # Declared larger than the whole quota: refused before a byte is written.
        r = c.put(f"{base}/files", params={"path": "huge.bin"}, content=b"y" * (40 * MIB))
        assert r.status_code == 413 and code(r) == "PAYLOAD_TOO_LARGE", r.text
        names = [e["name"] for e in c.get(f"{base}/files/list").json()["entries"]]
        assert names == ["fill"], names

        # Space freed: everything works again.
        again = _exec(c, sid, command="rm fill && head -c 1M /dev/zero > ok && wc -c < ok")
        assert again["stdout"].strip() == "1048576", again
        r = c.put(f"{base}/files", params={"path": "after.txt"}, content=b"fine")
        assert r.status_code == 200, r.text
        assert c.get(f"{base}/files", params={"path": "after.txt"}).content == b"fine"
    finally:
        c.delete(base)
    figures["fault: disk full"] = {
        "exec": f"exit {full['exit_code']}: {full['stderr'].strip()[:60]}",
        "upload": "413 PAYLOAD_TOO_LARGE",
        "daemon": "survived, writes work once space is freed",
    }


# -- a flood of output -------------------------------------------------------------------------


@pytest.mark.slow
def test_stdout_flood_caps_hold_and_memory_is_bounded(server, c, figures):
    sid = _create(c)
    cell = cell_of(server, c, sid)
    cg = _cgroup(cell)
    assert cg is not None
    (daemon,) = daemon_pids("sandcell", cell)
    daemon_before, router_before = rss_bytes(daemon), rss_bytes(server.proc.pid)
    base = f"/v1/sandboxes/{sid}"
    try:
        # `yes` until the timeout: the default cap of 1 MiB holds, the rest is dropped.
        started = time.monotonic()
        r = _exec(c, sid, command="yes", timeout_s=3)
        took = time.monotonic() - started
        assert r["timed_out"] and r["exit_code"] == 124 and r["stdout_truncated"], r["exit_code"]
        assert len(r["stdout"].encode()) == MIB and set(r["stdout"]) == {"y", "\n"}
        assert took < 8, f"a 3 s timeout answered after {took:.1f} s"

        # Binary garbage on both streams, a small cap: decoded with replacement, capped.
        r = _exec(
            c,
            sid,
            command="head -c 50M /dev/urandom; head -c 50M /dev/urandom >&2",
            max_output_bytes=65536,
        )
        assert r["exit_code"] == 0 and r["stdout_truncated"] and r["stderr_truncated"]
        assert 0 < len(r["stdout"]) <= 65536 and 0 < len(r["stderr"]) <= 65536

        # Streamed: every byte arrives (the cap bounds only a buffered result); the client
        # reading at its own pace holds `yes` back, so memory stays bounded all the same.
        streamed, exit_line = 0, None
        body = {"command": "yes", "timeout_s": 2, "max_output_bytes": 256 * 1024}
        with c.stream(
            "POST", f"{base}/exec", json=body, headers={"accept": "application/x-ndjson"}
        ) as resp:
            for line in resp.iter_lines():
                event = json.loads(line)
                if event["type"] == "exit":
                    exit_line = event
                else:
                    streamed += len(event["data"].encode())
        assert exit_line is not None and exit_line["timed_out"], exit_line
        assert not exit_line["stdout_truncated"] and streamed > 256 * 1024, streamed

        assert _exec(c, sid, command="echo alive")["stdout"] == "alive\n"
        daemon_after, router_after = rss_bytes(daemon), rss_bytes(server.proc.pid)
        assert cg.oom_kills() == 0
        assert daemon_after - daemon_before < 32 * MIB, (daemon_before, daemon_after)
        assert router_after - router_before < 32 * MIB, (router_before, router_after)
        peak = cg.memory_peak_bytes()
    finally:
        c.delete(base)
    figures["fault: stdout flood"] = {
        "kept_bytes_default_cap": MIB,
        "daemon_rss_mib": [round(daemon_before / MIB, 1), round(daemon_after / MIB, 1)],
        "router_rss_mib": [round(router_before / MIB, 1), round(router_after / MIB, 1)],
        "cell_memory_peak_mib": round(peak / MIB, 1),
        "oom_kills": 0,
    }


def test_largest_allowed_output_cap_does_not_kill_the_daemon(server, c):
    sid = _create(c)
    cell = cell_of(server, c, sid)
    cg = _cgroup(cell)
    assert cg is not None
    try:
        r = c.post(
            f"/v1/sandboxes/{sid}/exec",
            json={
                "command": "yes | head -c 100000000",
                "max_output_bytes": 64 * MIB,
                "timeout_s": 60,
            },
        )
        assert r.status_code == 200, r.text
        assert r.json()["stdout_truncated"]
        assert _exec(c, sid, command="echo alive")["stdout"] == "alive\n"
        assert cg.oom_kills() == 0
    finally:
        c.delete(f"/v1/sandboxes/{sid}")
