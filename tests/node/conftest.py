"""A real `sandcell node` on loopback: its own data dir, its own cluster CA and certificates
(tests/cluster made them by the same `sandcell cluster` commands), and a router's TLS client
context to reach it with."""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from sandcell.cluster import trust
from support.server import SMALL_TEMPLATE, free_port, sandcell_bin


@dataclass(frozen=True)
class Cluster:
    root: Path

    def member(self, role: trust.Role, name: str) -> Path:
        return trust.member_dir(self.root, role, name)


def make_cluster(root: Path) -> Cluster:
    trust.init(root)
    trust.issue(root, "node", "node-a", addresses=["127.0.0.1"])
    trust.issue(root, "node", "node-b", addresses=["127.0.0.1"])
    trust.issue(root, "router", "router-1")
    return Cluster(root)


@dataclass
class RunningNode:
    proc: subprocess.Popen[bytes]
    address: str
    data_dir: Path
    config: Path
    log: Path
    cluster: Cluster
    created: list[str] = field(default_factory=list)

    @property
    def port(self) -> int:
        return int(self.address.rpartition(":")[2])

    def router_context(self) -> ssl.SSLContext:
        return trust.client_context(self.cluster.member("router", "router-1"), "router")

    def control(self) -> httpx.Client:
        return httpx.Client(
            base_url=f"https://{self.address}", verify=self.router_context(), timeout=60
        )

    def create(self) -> dict:
        with self.control() as client:
            answer = client.post("/v1/cells", json={"owner": "key-1"})
        assert answer.status_code == 201, answer.text
        record = answer.json()
        self.created.append(record["id"])
        return record

    def roster(self) -> list[dict]:
        args = [sandcell_bin(), "nodes", "ls", "--json", "--data-dir", str(self.data_dir)]
        out = subprocess.run(
            [*args, "--config", str(self.config)], check=True, capture_output=True, text=True
        )
        return json.loads(out.stdout)

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            with self.control() as client:
                for sandbox_id in self.created:
                    client.delete(f"/v1/cells/{sandbox_id}")
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def start_node(
    root: Path, cluster: Cluster, name: str = "node-a", extra: tuple[str, ...] = ()
) -> RunningNode:
    data_dir = root / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    config = root / "node.toml"
    config.write_text(SMALL_TEMPLATE.format(warm_pool=0))
    port = free_port()
    log = root / "node.log"  # a restart appends: only what this start writes counts
    start = log.stat().st_size if log.exists() else 0
    args = [sandcell_bin(), "node", "--member", str(cluster.member("node", name))]
    args += ["--port", str(port), "--data-dir", str(data_dir), "--config", str(config)]
    args += ["--label", "zone=test", "--cells", "8", *extra]
    with log.open("ab") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ))
    node = RunningNode(proc, f"127.0.0.1:{port}", data_dir, config, log, cluster)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sandcell node exited: {log.read_text()[-3000:]}")
        if b"serving routers" in log.read_bytes()[start:]:
            return node
        time.sleep(0.05)
    node.stop()
    raise RuntimeError(f"sandcell node did not start: {log.read_text()[-3000:]}")


def exchange(context: ssl.SSLContext, port: int, data: bytes) -> bytes:
    """`data` sent over TLS to the node, and what it answers until it closes. A refused
    handshake raises ssl.SSLError or a reset."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        tls.sendall(data)
        got = b""
        while chunk := tls.recv(65536):
            got += chunk
        return got


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Cluster:
    return make_cluster(tmp_path_factory.mktemp("cluster") / "ca")


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory, cluster: Cluster) -> Iterator[RunningNode]:
    running = start_node(tmp_path_factory.mktemp("node"), cluster)
    try:
        yield running
    finally:
        running.stop()
