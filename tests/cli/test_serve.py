"""`sandcell serve` as its operator sees it: the banner, the log formats, a graceful stop that
closes the store and leaves live sandboxes for the next start. Real processes, real cells."""

from __future__ import annotations

import json
import logging
import re
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import redis_server
from sandcell.banner import tell_isolation
from sandcell.isolation.probe import LayerReport
from sandcell.manager.templates import Template
from sdk.helpers import stop_and_clean
from support.server import SMALL_TEMPLATE, RunningServer, free_port, sandcell_bin


def launch(tmp_path: Path, *args: str, warm_pool: int = 0, server_table: str = "") -> RunningServer:
    """`sandcell serve` on a fresh port, ready once its banner says it listens."""
    config = tmp_path / "sandcell.toml"
    config.write_text(server_table + SMALL_TEMPLATE.format(warm_pool=warm_pool))
    port = free_port()
    log = tmp_path / f"serve-{port}.log"
    data = tmp_path / "data"
    argv = ["serve", "--port", str(port), "--data-dir", str(data), "--config", str(config)]
    with log.open("wb") as out:
        proc = subprocess.Popen([sandcell_bin(), *argv, *args], stderr=out, stdout=out)
    server = RunningServer(proc, f"http://127.0.0.1:{port}", data, config, log)
    wait_for(server, "next       the API" if "json" not in args else '"openapi"')
    return server


def wait_for(server: RunningServer, text: str, timeout_s: float = 60) -> str:
    deadline = time.monotonic() + timeout_s
    while text not in (output := server.log.read_text()):
        assert server.proc.poll() is None or text in server.log.read_text(), output
        assert time.monotonic() < deadline, f"{text!r} never came:\n{output}"
        time.sleep(0.05)
    return output


def sigterm(server: RunningServer) -> int:
    server.proc.send_signal(signal.SIGTERM)
    return server.proc.wait(30)


@pytest.fixture
def servers() -> Iterator[list[RunningServer]]:
    """Every server a test starts is stopped and its cells destroyed, whatever happens."""
    started: list[RunningServer] = []
    yield started
    for server in started:
        stop_and_clean(server)


@pytest.mark.slow
def test_banner_graceful_stop_and_adoption(tmp_path: Path, servers: list[RunningServer]) -> None:
    first = launch(tmp_path, warm_pool=2)
    servers.append(first)
    banner = wait_for(first, "warm pool default: full, 2 cells ready")
    for fact in (
        f"listening on {first.url} (pid {first.proc.pid}, uvloop)",
        f"local cells in {first.data_dir / 'cells'}",
        f"(data dir {first.data_dir})",
        "isolation  all layers enforced: namespaces, identity, seccomp, landlock, cgroups",
        "templates  default (warm pool 2)",
        f"sandcell keys create NAME --data-dir {first.data_dir} --config {first.config}",
        f"the API: {first.url}/openapi.json",
    ):
        assert fact in banner, banner
    assert banner.count("warm pool default: full") == 1

    key = first.create_key("alice")
    with first.client(key) as c:
        sandbox = c.post("/v1/sandboxes", json={}).json()
        c.put(f"/v1/sandboxes/{sandbox['id']}/files", params={"path": "kept"}, content=b"yes")
        c.get("/v1/forged%0A2026-12-01 00:00:00 INFO  all fine%1B[2J")
    access = wait_for(first, "GET /v1/forged")
    assert "GET /v1/forged\\n2026-12-01 00:00:00 INFO  all fine\\x1b[2J 404" in access
    assert "\x1b" not in access and "\nINFO  all fine" not in access

    assert sigterm(first) == 0
    said = first.log.read_text()
    assert "shutting down (SIGTERM): no new connections" in said
    assert re.search(r"warm pools drained: [12] unclaimed cells? destroyed", said)  # a refill?
    assert "1 sandbox stays running for the next start to adopt" in said
    assert "Traceback" not in said
    # The store was closed: SQLite folds its write-ahead log back and removes it.
    left = sorted(p.name for p in first.data_dir.iterdir())
    assert left == ["cells", "images", "sandcell.db", "store.key"]

    second = launch(tmp_path)
    servers.append(second)
    assert (
        "from the last run: 1 live sandbox adopted, 0 dead ones cleaned up"
        in second.log.read_text()
    )
    with second.client(key) as c:
        r = c.get(f"/v1/sandboxes/{sandbox['id']}/files", params={"path": "kept"})
        assert r.status_code == 200 and r.content == b"yes"
        assert c.delete(f"/v1/sandboxes/{sandbox['id']}").status_code == 204
    assert sigterm(second) == 0
    assert "0 sandboxes stay running" in second.log.read_text()


@pytest.mark.slow
def test_json_logs_without_access_log_and_cleanup_on_exit(
    tmp_path: Path, servers: list[RunningServer]
) -> None:
    server = launch(tmp_path, "--log-format", "json", "--no-access-log", "--cleanup-on-exit")
    servers.append(server)
    key = server.create_key("alice")
    with server.client(key) as c, ThreadPoolExecutor(1) as pool:
        sandbox = c.post("/v1/sandboxes", json={}).json()
        command = {"command": "sleep 1; echo finished"}
        in_flight = pool.submit(c.post, f"/v1/sandboxes/{sandbox['id']}/exec", json=command)
        time.sleep(0.3)
        assert sigterm(server) == 0
        assert in_flight.result().json()["stdout"] == "finished\n"  # finished, not cut
    assert list((server.data_dir / "cells").iterdir()) == []

    lines = [json.loads(line) for line in server.log.read_text().splitlines()]
    by_message = {line["message"]: line for line in lines}
    started = next(line for line in lines if "url" in line)
    assert started["url"] == server.url and started["level"] == "INFO"
    assert next(line for line in lines if "data_dir" in line)["data_dir"] == str(server.data_dir)
    pools = next(line for line in lines if "warm_pools" in line)["warm_pools"]
    assert pools == {"default": 0, "code-interpreter": 0}  # a built-in: built on first use
    assert by_message["deleted 1 sandbox (--cleanup-on-exit)"]["deleted"] == 1
    assert any(m.startswith("shutting down (SIGTERM)") for m in by_message)
    assert not [line for line in lines if line["logger"] == "sandcell.access"]


def test_bad_log_options_are_refused(tmp_path: Path) -> None:
    for args in (["--log-format", "xml"], ["--log-level", "loud"]):
        done = subprocess.run(
            [sandcell_bin(), "serve", "--data-dir", str(tmp_path), *args],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.returncode == 2 and "must be one of" in done.stderr, done.stderr


@pytest.mark.slow
def test_store_outage_is_told_once_each_way(
    tmp_path: Path, own_redis: tuple[subprocess.Popen[bytes], str], servers: list[RunningServer]
) -> None:
    redis_proc, url = own_redis
    server = launch(tmp_path, server_table=f'[server]\nstore = "{url}"\n')
    servers.append(server)
    redis_proc.kill()
    wait_for(server, "store unreachable")
    with server.client("sc_any") as c:
        for _ in range(5):
            assert c.get("/v1/sandboxes").status_code == 503
    (tmp_path / "again").mkdir()
    with redis_server(tmp_path / "again", port=int(url.rsplit(":", 1)[1].split("/")[0])):
        said = wait_for(server, "store reachable again after")
        assert sigterm(server) == 0
    assert said.count("store unreachable") == 1 and said.count("reachable again") == 1


def test_a_missing_layer_is_told_loudly(caplog: pytest.LogCaptureFixture) -> None:
    """What the banner says on a host without cgroups (as `probe_host` reports it)."""
    reports = [
        LayerReport("namespaces", True, "bubblewrap"),
        LayerReport("cgroups", False, "no writable cgroup hierarchy"),
    ]
    templates = {
        "default": Template(),
        "lax": Template(name="lax", allow_degraded=("cgroups",)),
    }
    with caplog.at_level(logging.INFO, logger="sandcell.serve"):
        tell_isolation(reports, templates)
    assert [r.levelname for r in caplog.records] == ["WARNING", "WARNING"]
    summary, detail = (r.getMessage() for r in caplog.records)
    assert "DEGRADED: cgroups missing; enforced: namespaces" in summary
    assert "cgroups is NOT enforced on this host (no writable cgroup hierarchy)" in detail
    assert "templates ['lax'] run WITHOUT it" in detail
    assert "templates ['default'] refuse to start (503 ISOLATION_UNAVAILABLE)" in detail


@pytest.mark.slow
def test_a_failed_start_says_why_and_leaves_nothing(tmp_path: Path) -> None:
    """A port already taken, a store that does not answer: one clear line, exit 3, no cell."""
    config = tmp_path / "sandcell.toml"
    data = tmp_path / "data"
    base = [sandcell_bin(), "serve", "--data-dir", str(data), "--config", str(config)]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        config.write_text(SMALL_TEMPLATE.format(warm_pool=1))
        port = str(taken.getsockname()[1])
        argv = [*base, "--port", port, "--log-format", "json"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    lines = [json.loads(line) for line in done.stderr.splitlines()]  # uvicorn's own too
    assert done.returncode == 3, done.stderr
    assert "address already in use" in lines[0]["message"] and lines[0]["level"] == "ERROR"
    assert lines[-1]["message"] == "warm pools drained: 1 unclaimed cell destroyed"
    assert list((data / "cells").iterdir()) == []

    config.write_text(f'[server]\nstore = "redis://127.0.0.1:{free_port()}/0"\n')
    done = subprocess.run(base, capture_output=True, text=True, timeout=60)
    assert done.returncode == 3 and "Traceback" not in done.stderr, done.stderr
    assert "cannot start: the store redis://127.0.0.1:" in done.stderr
