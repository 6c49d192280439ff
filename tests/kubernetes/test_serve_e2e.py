"""`sandcell serve --backend kubernetes` against the fake cluster, end to end through the router."""

from __future__ import annotations

import base64
import json
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import kubernetes_validate
import pytest
from websockets.sync.client import connect as ws_connect

from support.server import RunningServer, sandcell_bin, start_server

from .cluster import FakeCluster
from .conftest import NAMESPACE

MANAGER = "sandcell-0"
OWNER_SELECTOR = f"app.kubernetes.io/managed-by=sandcell,sandcell.dev/manager={MANAGER}"
CONFIG = """
[server]
reap_interval_s = 1

[kubernetes]
api_server = "{url}"
namespace = "{namespace}"
manager_id = "{manager}"
runtime_class = "gvisor"

[templates.default]
memory_mb = 256
cpus = 0.5
disk_mb = 128
warm_pool = 1
max_lifetime_s = 600

[templates.big]
memory_mb = 384
disk_mb = 128
warm_pool = 1
"""
DAEMON_ENV = {"SANDCELL_SANDBOX_ID", "SANDCELL_BOOTSTRAP_PUBLIC_KEY", "SANDCELL_WORKSPACE"}


@pytest.fixture
def serve(cluster: FakeCluster, tmp_path: Path) -> Iterator[Callable[..., RunningServer]]:
    """Starts `sandcell serve` on one data dir; whatever a test leaves running is stopped."""
    started: list[RunningServer] = []

    def start(port: int | None = None) -> RunningServer:
        config = CONFIG.format(url=cluster.url, namespace=NAMESPACE, manager=MANAGER)
        server = start_server(
            tmp_path / "data",
            config_text=config,
            port=port,
            extra_env={"SANDCELL_BACKEND": "kubernetes"},  # what `--backend` reads from env
        )
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def ready_pods(cluster: FakeCluster) -> dict[str, dict]:
    return {
        p["metadata"]["name"]: p
        for p in cluster.pods(NAMESPACE)
        if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    }


def pool_of(cluster: FakeCluster, template: str) -> set[str]:
    return {
        name
        for name, pod in ready_pods(cluster).items()
        if pod["metadata"]["labels"]["sandcell.dev/template"] == template
    }


def pools_full(server: RunningServer) -> bool:
    """Both warm pools hold an initialised pod (as the manager counts, not only the node)."""
    text = httpx.get(f"{server.url}/metrics").text
    return all(f'sandcell_pool_ready{{template="{t}"}} 1.0' in text for t in ("default", "big"))


def create(c: httpx.Client, **body) -> dict:
    r = c.post("/v1/sandboxes", json=body)
    assert r.status_code == 201, r.text
    return r.json()


def test_backend_flag_selects_kubernetes(tmp_path):
    config = tmp_path / "sandcell.toml"
    config.write_text(f'[kubernetes]\nkubeconfig = "{tmp_path}/missing"\n')
    r = subprocess.run(
        [
            sandcell_bin(),
            "serve",
            "--backend",
            "kubernetes",
            "--config",
            str(config),
            "--data-dir",
            str(tmp_path / "data"),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 2 and "no usable cluster configuration" in r.stderr, r.stderr


@pytest.mark.slow
def test_create_exec_files_delete_through_the_router(cluster, serve):
    server = serve()
    key = server.create_key("alice")
    cluster.wait_for(lambda: pools_full(server), message="warm pools")
    warm = pool_of(cluster, "default")
    with server.client(key) as c:
        sbx = create(c)
        assert {sbx["id"]} == warm  # the warm pod was claimed: its name is the sandbox's
        base = f"/v1/sandboxes/{sbx['id']}"
        r = c.post(f"{base}/exec", json={"command": "echo $((6*7)) $(id -u)"})
        assert r.status_code == 200 and r.json()["stdout"] == "42 1000\n", r.text
        r = c.put(f"{base}/files", params={"path": "data/a.txt"}, content=b"hello pod")
        assert r.status_code == 200 and r.json()["size"] == 9, r.text
        assert c.get(f"{base}/files", params={"path": "data/a.txt"}).content == b"hello pod"
        r = c.post(f"{base}/exec", json={"command": "cat data/a.txt; env | grep -c SANDCELL"})
        assert r.json()["stdout"] == "hello pod0\n"

        pod = next(p for p in cluster.received() if p["metadata"]["name"] == sbx["id"])
        check_pod_spec(pod, sbx["id"])

        assert c.delete(base).status_code == 204
        assert ("DELETE", pod_url(cluster, sbx["id"])) in [
            (m, u.split("?")[0]) for m, u in cluster.requests()
        ]
        cluster.wait_for(lambda: cluster.pod(sbx["id"]) is None, message="pod deleted")
        cluster.wait_for(lambda: pools_full(server), message="warm pool refilled")
        assert pool_of(cluster, "default").isdisjoint(warm)

        # With its own env, a sandbox gets a pod of its own (pooled ones were initialised
        # before anyone's env was known).
        other = create(c, template="big", env={"A": "1"})
        assert other["id"] not in warm
        r = c.post(f"/v1/sandboxes/{other['id']}/exec", json={"command": "echo $A"})
        assert r.json()["stdout"] == "1\n"
        big = cluster.pod(other["id"])["spec"]["containers"][0]["resources"]["limits"]
        assert big["memory"] == "384Mi"
        assert c.delete(f"/v1/sandboxes/{other['id']}").status_code == 204
    server.stop()
    # A graceful stop drains the warm pools: no pod is left once the node has stopped them.
    cluster.wait_for(lambda: cluster.pods(NAMESPACE) == [], message="pool pods deleted")
    assert cluster.running_processes() == set()


def pod_url(cluster: FakeCluster, name: str) -> str:
    return f"{cluster.url}/api/v1/namespaces/{NAMESPACE}/pods/{name}"


def check_pod_spec(pod: dict, sandbox_id: str) -> None:
    """What the API server received, as the backend sent it."""
    kubernetes_validate.validate(pod, "1.30", strict=True)
    assert pod["metadata"]["labels"] == {
        "app.kubernetes.io/name": "sandcell-sandbox",
        "app.kubernetes.io/managed-by": "sandcell",
        "sandcell.dev/manager": MANAGER,
        "sandcell.dev/template": "default",
        "sandcell.dev/sandbox": sandbox_id,
    }
    spec = pod["spec"]
    assert spec["activeDeadlineSeconds"] == 600 + 3600  # max_lifetime_s + max_pool_wait_s
    assert spec["restartPolicy"] == "Never" and spec["runtimeClassName"] == "gvisor"
    assert spec["automountServiceAccountToken"] is False
    assert spec["enableServiceLinks"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = spec["containers"]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }
    limits = {"cpu": "500m", "memory": "256Mi", "ephemeral-storage": "128Mi"}
    assert container["resources"] == {"requests": limits, "limits": limits}
    assert {e["name"] for e in container["env"]} == DAEMON_ENV
    assert all(set(e) == {"name", "value"} for e in container["env"])  # no valueFrom
    assert container["command"][:4] == ["sandcell", "daemon", "--listen", "0.0.0.0:8701"]


@pytest.mark.slow
def test_restart_adopts_live_pods_and_deletes_orphans(cluster, serve):
    first = serve()
    key = first.create_key("alice")
    with first.client(key) as c:
        live, dead = create(c), create(c, template="big")
        c.put(f"/v1/sandboxes/{live['id']}/files", params={"path": "keep.txt"}, content=b"kept")
    cluster.wait_for(lambda: pools_full(first), message="warm pools")
    orphans = (pool_of(cluster, "default") | pool_of(cluster, "big")) - {live["id"], dead["id"]}
    assert len(orphans) == 2
    first.stop(sig=9)  # no draining: the pool pods stay, and no one knows them now
    cluster.kill_container(dead["id"])
    cluster.wait_for(lambda: cluster.pod(dead["id"])["status"]["phase"] == "Failed")
    stranger = stranger_pod(cluster)

    second = serve(port=int(first.url.rsplit(":", 1)[1]))
    with second.client(key) as c:
        ids = [s["id"] for s in c.get("/v1/sandboxes").json()["sandboxes"]]
        assert ids == [live["id"]]
        r = c.get(f"/v1/sandboxes/{live['id']}/files", params={"path": "keep.txt"})
        assert r.content == b"kept"
        r = c.post(f"/v1/sandboxes/{live['id']}/exec", json={"command": "echo ok"})
        assert r.json()["stdout"] == "ok\n"
    listed = [
        parse_qs(urlsplit(u).query).get("labelSelector")
        for m, u in cluster.requests()
        if m == "GET" and "watch" not in u and u.split("?")[0].endswith("/pods")
    ]
    assert [OWNER_SELECTOR] in listed  # reconciliation found its pods by label
    cluster.wait_for(lambda: cluster.pod(dead["id"]) is None, message="dead pod deleted")
    cluster.wait_for(lambda: not orphans & set(ready_pods(cluster)), message="orphans")
    assert cluster.pod(stranger) is not None  # another manager's pod is not ours to reap
    cluster.wait_for(lambda: pools_full(second), message="warm pools refilled")
    second.stop()
    # Drained pools are deleted; the live sandbox keeps running, as does the stranger.
    cluster.wait_for(
        lambda: {p["metadata"]["name"] for p in cluster.pods(NAMESPACE)} == {live["id"], stranger}
    )


def stranger_pod(cluster: FakeCluster) -> str:
    """A pod of another replica (sandcell-1), which this one must leave alone."""
    pod = {
        "metadata": {
            "name": "sbx-from-another-replica",
            "labels": {
                "app.kubernetes.io/managed-by": "sandcell",
                "sandcell.dev/manager": "sandcell-1",
            },
        },
        "spec": {"containers": [{"name": "daemon", "image": "x", "command": ["sleep", "1"]}]},
    }
    r = httpx.post(f"{cluster.url}/api/v1/namespaces/{NAMESPACE}/pods", json=pod)
    assert r.status_code == 201, r.text
    return pod["metadata"]["name"]


@pytest.mark.slow
def test_processes_terminals_and_metrics_on_pods(cluster, serve):
    """SPEC §9 on the Kubernetes backend: background processes, stdin, a WebSocket terminal
    through the router to the pod's daemon, and metrics refused with a clear 501."""
    server = serve()
    key = server.create_key("procs")
    cluster.wait_for(lambda: pools_full(server), message="warm pools")
    with server.client(key) as c:
        base = f"/v1/sandboxes/{create(c)['id']}"
        r = c.post(f"{base}/processes", json={"command": "cat", "stdin": True})
        assert r.status_code == 201, r.text
        pid = r.json()["pid"]
        assert c.post(f"{base}/processes/{pid}/stdin", content=b"via pod\n").status_code == 204
        assert c.post(f"{base}/processes/{pid}/stdin/close").status_code == 204
        lines = c.get(f"{base}/processes/{pid}/output", params={"follow": "true"}).text
        events = [json.loads(line) for line in lines.splitlines()]
        assert base64.b64decode(events[0]["data_b64"]) == b"via pod\n"
        assert events[-1]["type"] == "exit" and events[-1]["exit_code"] == 0

        r = c.post(f"{base}/processes", json={"command": ["/bin/sh"], "pty": {}})
        ws_url = "ws" + server.url.removeprefix("http") + f"{base}/processes/{r.json()['pid']}/ws"
        headers = {"authorization": f"Bearer {key}"}
        with ws_connect(ws_url, additional_headers=headers, open_timeout=10) as ws:
            ws.send(b"echo $((6*7)); exit 3\n")
            frames = []
            while not (frames and isinstance(frames[-1], str)):
                frames.append(ws.recv(timeout=10))
        assert b"42" in b"".join(f for f in frames if isinstance(f, bytes))
        assert json.loads(frames[-1])["exit_code"] == 3

        r = c.get(f"{base}/metrics")
        assert r.status_code == 501 and r.json()["error"]["code"] == "NOT_IMPLEMENTED"
        assert c.delete(base).status_code == 204
