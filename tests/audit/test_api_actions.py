"""The audit trail of a real `sandcell serve` (SPEC §20): each action through `/v1` leaves its
record naming the principal and key; `GET /v1/audit` shows a key its own records only, an admin
everyone's, and refuses bad input by name; neither a secret's value, a file's contents nor (in
the default digest mode) a command's text is anywhere in the store or the sink; the chain of a
real run verifies; `sandcell audit tail -f` follows it."""

from __future__ import annotations

import hashlib
import json
import os
import select
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sdk.helpers import served
from support.host_http import host_server
from support.server import RunningServer, sandcell_bin

pytestmark = pytest.mark.slow

SECRET_VALUE = "sk-audit-NEVER-RECORDED-4f1c"
FILE_CONTENT = b"file contents the trail never keeps 9d2e"
COMMAND = "echo marker-of-the-command-text-77a1"


def config(sink: Path) -> str:
    return f"""
[server]
reap_interval_s = 1

[audit]
sink = "{sink}"

[templates.default]
memory_mb = 256
pids_max = 128
disk_mb = 128
warm_pool = 1
network_max = "open"
network_internal = true
"""


@pytest.fixture(scope="module")
def host_port() -> Iterator[int]:
    srv, port = host_server()
    yield port
    srv.shutdown()


@pytest.fixture(scope="module")
def sink(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("audit-sink") / "audit.jsonl"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, sink: Path) -> Iterator[RunningServer]:
    yield from served(tmp_path_factory.mktemp("audit"), config_text=config(sink))


@pytest.fixture(scope="module")
def keys(server: RunningServer) -> dict[str, str]:
    return {
        "alice": server.create_key("alice"),
        "bob": server.create_key("bob"),
        "root": server.create_key("ops", admin=True),
    }


def audit(http: httpx.Client, **params: str) -> list[dict]:
    answer = http.get("/v1/audit", params={"limit": "1000", **params})
    assert answer.status_code == 200, answer.text
    return answer.json()["records"]


@pytest.fixture(scope="module")
def acted(server: RunningServer, keys: dict[str, str], host_port: int) -> dict[str, str]:
    """Alice does one of each action through /v1; returns the ids involved."""
    with server.client(keys["alice"]) as http:
        sbx = http.post("/v1/sandboxes", json={"metadata": {"job": "audit"}}).json()["id"]
        base = f"/v1/sandboxes/{sbx}"
        assert http.post(f"{base}/exec", json={"command": COMMAND}).status_code == 200
        assert http.put(f"{base}/files", params={"path": "a.txt"}, content=FILE_CONTENT).is_success
        assert http.get(f"{base}/files", params={"path": "a.txt"}).content == FILE_CONTENT
        assert http.get(f"{base}/files", params={"path": "nope.txt"}).status_code == 404
        assert http.get(f"{base}/files/list", params={"path": "."}).is_success
        assert http.post(f"{base}/files/mkdir", json={"path": "d"}).is_success
        assert http.post(f"{base}/files/move", json={"from": "a.txt", "to": "d/b.txt"}).is_success
        assert http.delete(f"{base}/files", params={"path": "d/b.txt"}).is_success
        started = http.post(f"{base}/processes", json={"command": "sleep 60"}).json()
        assert http.post(
            f"{base}/processes/{started['pid']}/signal", json={"signal": "SIGTERM"}
        ).is_success
        assert http.post(f"{base}/keepalive", json={"idle_timeout_s": 200}).is_success
        net = {"egress": "allowlist", "allow": [f"127.0.0.1:{host_port}"]}
        assert http.patch(f"{base}/network", json=net).is_success, "network"
        fetch = f"curl -sf http://127.0.0.1:{host_port}/ ; curl -sf http://127.0.0.2:9/"
        no_bypass = {"NO_PROXY": "", "no_proxy": ""}  # loopback through the proxy too
        fetched = http.post(f"{base}/exec", json={"command": fetch, "env": no_bypass})
        assert fetched.status_code == 200
        secret = {"name": "TOKEN", "value": SECRET_VALUE, "hosts": ["api.example.com"]}
        assert http.post("/v1/secrets", json=secret).status_code == 201
        assert http.put("/v1/secrets/TOKEN", json={"value": SECRET_VALUE + "-2"}).is_success
        assert http.delete("/v1/secrets/TOKEN").status_code == 204
        snap = http.post(f"{base}/snapshots", json={"name": "s"}).json()["id"]
        child = http.post(f"{base}/fork").json()["id"]
        assert http.post(f"{base}/pause").is_success
        assert http.post(f"{base}/resume").is_success
        assert http.delete(f"/v1/snapshots/{snap}").status_code == 204
        assert http.delete(base).status_code == 204
        assert http.delete(f"/v1/sandboxes/{child}").status_code == 204
    return {"sandbox": sbx, "child": child, "snapshot": snap}


def test_each_action_through_the_api_is_recorded(
    server: RunningServer, keys: dict[str, str], acted: dict[str, str], host_port: int
) -> None:
    with server.client(keys["alice"]) as http:
        records = audit(http, sandbox=acted["sandbox"])
    # The sandbox's own code connects out: its owner, with no key.
    by_code = {"egress.decision", "secret.use"}
    assert {(r["principal"], r["key_name"]) for r in records if r["action"] not in by_code} == {
        ("alice", "alice")
    }
    assert {(r["principal"], r["key_name"]) for r in records if r["action"] in by_code} == {
        ("alice", "")
    }
    by_action: dict[str, list[dict]] = {}
    for rec in records:
        by_action.setdefault(rec["action"], []).append(rec)
    for action in (
        "sandbox.create",
        "exec",
        "file.write",
        "file.read",
        "file.list",
        "file.mkdir",
        "file.move",
        "file.remove",
        "process.start",
        "process.signal",
        "sandbox.timeout",
        "network.change",
        "egress.decision",
        "sandbox.snapshot",
        "sandbox.fork",
        "sandbox.pause",
        "sandbox.resume",
        "snapshot.delete",
        "sandbox.delete",
    ):
        assert action in by_action, f"no {action} record in {sorted(by_action)}"
    digest = hashlib.sha256(COMMAND.encode()).hexdigest()
    exec_ = by_action["exec"][0]
    assert exec_["touched"] == {"command_length": len(COMMAND), "command_sha256": digest}
    assert (exec_["outcome"], exec_["status"]) == ("ok", 200)
    write = by_action["file.write"][0]["touched"]
    assert write == {"path": "a.txt", "size": len(FILE_CONTENT)}
    reads = [(r["outcome"], r["status"], r["touched"]) for r in by_action["file.read"]]
    assert ("ok", 200, {"path": "a.txt", "size": len(FILE_CONTENT)}) in reads
    assert ("refused", 404, {"path": "nope.txt"}) in reads
    assert by_action["file.move"][0]["touched"] == {"path": "a.txt", "to": "d/b.txt"}
    assert by_action["process.signal"][0]["touched"] == {"signal": "SIGTERM"}
    assert by_action["sandbox.timeout"][0]["touched"] == {"timeout_s": 200}
    assert by_action["network.change"][0]["touched"] == {"egress": "allowlist"}
    decisions = {
        (r["touched"]["host"], r["touched"]["port"], r["touched"]["decision"])
        for r in by_action["egress.decision"]
    }
    assert ("127.0.0.1", host_port, "allowed") in decisions
    assert ("127.0.0.2", 9, "refused") in decisions
    fork = by_action["sandbox.fork"][0]["touched"]
    assert fork["child"] == acted["child"]
    assert by_action["snapshot.delete"][-1]["touched"] == {"snapshot": acted["snapshot"]}
    with server.client(keys["alice"]) as http:
        secrets = audit(http, action="secret.create") + audit(http, action="secret.delete")
    assert [r["touched"] for r in secrets] == [{"secret": "TOKEN"}, {"secret": "TOKEN"}]


def test_a_key_reads_its_own_records_only(
    server: RunningServer, keys: dict[str, str], acted: dict[str, str]
) -> None:
    with server.client(keys["bob"]) as http:
        assert audit(http, sandbox=acted["sandbox"]) == []
        assert all(r["principal"] == "bob" for r in audit(http))
        refused = http.get("/v1/audit", params={"principal": "alice"})
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "FORBIDDEN"
    with server.client(keys["root"]) as http:
        assert audit(http, sandbox=acted["sandbox"])
        assert {r["principal"] for r in audit(http, principal="alice")} == {"alice"}
    with server.client() as http:
        assert http.get("/v1/audit").status_code == 401
        assert (
            http.get("/v1/audit", headers={"authorization": "Bearer sc_wrong"}).status_code == 401
        )


@pytest.mark.parametrize(
    ("params", "named"),
    [
        ({"since": "yesterday"}, "since"),
        ({"until": "2026-12-02T06:00:00"}, "until"),
        ({"limit": "0"}, "limit"),
        ({"limit": "100000"}, "limit"),
        ({"action": "rm -rf"}, "action"),
        ({"after": "not-a-cursor"}, "after"),
        ({"sandbox": "x" * 300}, "sandbox"),
        ({"colour": "red"}, "colour"),
    ],
)
def test_bad_queries_are_refused_by_name(
    server: RunningServer, keys: dict[str, str], params: dict[str, str], named: str
) -> None:
    with server.client(keys["alice"]) as http:
        answer = http.get("/v1/audit", params=params)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["details"] == {"param": named}


def test_pages_follow_one_another(
    server: RunningServer, keys: dict[str, str], acted: dict[str, str]
) -> None:
    with server.client(keys["alice"]) as http:
        whole = audit(http)
        seen, after = [], None
        while True:
            params = {"limit": "3", **({"after": after} if after else {})}
            page = http.get("/v1/audit", params=params).json()
            seen += page["records"]
            if not page["next"]:
                break
            after = page["next"]
        since = whole[len(whole) // 2]["at"]
        later = audit(http, since=str(since))
    assert [(r["writer"], r["seq"]) for r in seen] == [(r["writer"], r["seq"]) for r in whole]
    assert later and all(r["at"] >= since for r in later)


def test_no_secret_value_file_content_or_command_text_is_kept(
    server: RunningServer, keys: dict[str, str], acted: dict[str, str], sink: Path
) -> None:
    with server.client(keys["alice"]) as http:
        assert audit(http)  # flushed: the store and the sink have everything
    kept = b"".join(p.read_bytes() for p in server.data_dir.glob("sandcell.db*"))
    kept += sink.read_bytes()
    for needle in (SECRET_VALUE.encode(), FILE_CONTENT, b"marker-of-the-command-text"):
        assert needle not in kept
    lines = [json.loads(line) for line in sink.read_text().splitlines()]
    assert {"exec", "file.write", "secret.create"} <= {rec["action"] for rec in lines}


def test_the_trail_of_a_real_run_verifies(server: RunningServer, acted: dict[str, str]) -> None:
    args = ["audit", "verify", "--data-dir", str(server.data_dir), "--config", str(server.config)]
    done = subprocess.run([sandcell_bin(), *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("audit trail intact:")


def test_tail_follows_new_records(server: RunningServer, keys: dict[str, str]) -> None:
    env = {"SANDCELL_URL": server.url, "SANDCELL_API_KEY": keys["bob"], "PATH": "/usr/bin:/bin"}
    tail = subprocess.Popen(
        [sandcell_bin(), "audit", "tail", "-f", "--every", "0.2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    try:
        with server.client(keys["bob"]) as http:
            created = http.post("/v1/sandboxes", json={})
            assert created.status_code == 201
            http.delete(f"/v1/sandboxes/{created.json()['id']}")
        assert tail.stdout is not None
        deadline, out, seen = time.monotonic() + 30, b"", list[str]()
        while "sandbox.delete" not in seen:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([tail.stdout], [], [], max(left, 0))
            assert ready, f"tail printed nothing more in time: {seen}"
            chunk = os.read(tail.stdout.fileno(), 65536)
            assert chunk, tail.stderr.read() if tail.stderr else "tail ended"
            *lines, out = (out + chunk).split(b"\n")
            for line in lines:
                rec = json.loads(line)
                assert rec["principal"] == "bob"
                seen.append(rec["action"])
        assert seen[-2:] == ["sandbox.create", "sandbox.delete"]
    finally:
        tail.terminate()
        tail.wait(10)


def test_key_commands_on_the_host_are_recorded(server: RunningServer, keys: dict[str, str]) -> None:
    """`sandcell keys` has no API key: its records name the host's user, in a chain of the
    host's commands; two at once both land, the chain intact."""
    makes = [
        subprocess.Popen(
            [
                sandcell_bin(),
                "keys",
                "create",
                name,
                "--data-dir",
                str(server.data_dir),
                "--config",
                str(server.config),
            ],
            stdout=subprocess.DEVNULL,
        )
        for name in ("carol", "dave")
    ]
    assert [p.wait(60) for p in makes] == [0, 0]
    server.revoke_key("carol")
    with server.client(keys["root"]) as http:
        made = audit(http, action="key.create")
        revoked = audit(http, action="key.revoke")
    names = {r["touched"]["key"] for r in made}
    assert {"alice", "bob", "ops", "carol", "dave"} <= names
    assert {r["principal"] for r in made} == {"operator:root"}
    assert {r["writer"].split("@")[0] for r in made} == {"operator"}
    assert [r["touched"] for r in revoked] == [{"key": "carol"}]
    with server.client(keys["alice"]) as http:
        assert audit(http, action="key.create") == []  # the operator's, not alice's
    test_the_trail_of_a_real_run_verifies(server, {})
