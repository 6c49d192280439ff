"""A fake cluster per test (API server + node running real daemons) and backends over it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from sandcell.manager.k8s.backend import KubernetesBackend
from sandcell.manager.k8s.config import KubernetesConfig
from sandcell.manager.templates import Template

from .cluster import FakeCluster

NAMESPACE = "sandboxes"
SMALL = {"memory_mb": 256, "pids_max": 64, "disk_mb": 64, "warm_pool": 0}


@pytest.fixture
def cluster() -> Iterator[FakeCluster]:
    fake = FakeCluster().start()
    try:
        yield fake
    finally:
        fake.stop()


def kubeconfig_for(cluster: FakeCluster, path: Path) -> Path:
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: fake\n"
        f"clusters:\n- name: fake\n  cluster:\n    server: {cluster.url}\n"
        f"contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n"
        "    namespace: elsewhere\n"
        "users:\n- name: fake\n  user:\n    token: not-checked\n"
    )
    return path


@pytest.fixture
async def make_backend(
    cluster: FakeCluster,
) -> AsyncIterator[Callable[..., KubernetesBackend]]:
    made: list[KubernetesBackend] = []

    def make(templates: dict[str, dict] | None = None, **settings) -> KubernetesBackend:
        config = KubernetesConfig(
            **{
                "api_server": cluster.url,
                "namespace": NAMESPACE,
                "manager_id": "mgr-a",
                "ready_timeout_s": 20,
                **settings,
            }
        )
        specs = templates or {"default": {}}
        built = {name: Template(name=name, **{**SMALL, **s}) for name, s in specs.items()}
        backend = KubernetesBackend(config, built)
        made.append(backend)
        return backend

    yield make
    for backend in made:
        await backend.aclose()
