"""Secrets (SPEC §17) on the Kubernetes backend: pods get no substituting proxy yet, so a
create with `secrets` is refused by name (field and backend), in the spec's error shape,
before any pod is made or claimed; a create without them still works."""

from __future__ import annotations

import pytest

from support.server import start_server

from .cluster import FakeCluster
from .conftest import NAMESPACE

CONFIG = """
[kubernetes]
api_server = "{url}"
namespace = "{namespace}"
manager_id = "sandcell-secrets"

[templates.default]
memory_mb = 256
disk_mb = 128
warm_pool = 0
network_max = "open"
"""


@pytest.mark.slow
def test_a_create_with_secrets_is_refused_by_name(cluster: FakeCluster, tmp_path) -> None:
    config = CONFIG.format(url=cluster.url, namespace=NAMESPACE)
    server = start_server(
        tmp_path / "data", config_text=config, extra_env={"SANDCELL_BACKEND": "kubernetes"}
    )
    try:
        with server.client(server.create_key("alice")) as c:
            body = {"name": "API_TOKEN", "value": "sk-never-in-a-pod", "hosts": ["api.test"]}
            assert c.post("/v1/secrets", json=body).status_code == 201
            r = c.post("/v1/sandboxes", json={"secrets": ["API_TOKEN"]})
            assert r.status_code == 501, r.text
            error = r.json()["error"]
            assert error["code"] == "NOT_IMPLEMENTED"
            assert error["details"] == {"field": "secrets", "backend": "kubernetes"}
            assert "`secrets`" in error["message"] and "kubernetes" in error["message"]
            assert "sk-never-in-a-pod" not in r.text
            assert cluster.pods(NAMESPACE) == []  # refused before any pod was made
            assert c.get("/v1/sandboxes").json()["sandboxes"] == []

            made = c.post("/v1/sandboxes", json={})  # the refusal left no reservation behind
            assert made.status_code == 201, made.text
            assert c.delete(f"/v1/sandboxes/{made.json()['id']}").status_code == 204
    finally:
        server.stop()
    assert "sk-never-in-a-pod" not in server.log.read_text()
