"""The Kubernetes backend over real HTTP against the fake cluster, whose node runs real daemons."""

from __future__ import annotations

import asyncio
import secrets
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from sandcell import tokens
from sandcell.cellapi.client import DaemonClient
from sandcell.errors import ServiceError
from sandcell.manager.init import initialize
from sandcell.manager.k8s.backend import KubernetesBackend
from sandcell.manager.templates import Template

from .cluster import FakeCluster
from .conftest import NAMESPACE, SMALL, kubeconfig_for

pytestmark = pytest.mark.anyio
BOOTSTRAP = tokens.generate_p256()
POLICY = Template(**SMALL).policy()


def new_id() -> str:
    return f"sbx-{secrets.token_hex(8)}"


def watches(cluster: FakeCluster, name: str) -> list[dict[str, list[str]]]:
    """The query of every watch request made on one pod, in order."""
    found = []
    for method, url in cluster.requests():
        query = parse_qs(urlsplit(url).query)
        on_pod = query.get("fieldSelector") == [f"metadata.name={name}"]
        if method == "GET" and query.get("watch") == ["true"] and on_pod:
            found.append(query)
    return found


async def until(predicate, timeout_s: float = 10) -> None:
    async with asyncio.timeout(timeout_s):
        while not await asyncio.to_thread(predicate):
            await asyncio.sleep(0.05)


async def test_create_waits_for_ready_then_init_exec_and_destroy(cluster, make_backend):
    backend = make_backend(runtime_class="gvisor")
    sandbox_id = new_id()
    handle = await backend.create(POLICY, sandbox_id, tokens.public_pem(BOOTSTRAP))

    # The readiness gate: the pod the fake holds is Running and Ready by the time create returns.
    pod = cluster.pod(sandbox_id)
    assert pod is not None and pod["status"]["phase"] == "Running"
    assert {"type": "Ready", "status": "True"}.items() <= next(
        c for c in pod["status"]["conditions"] if c["type"] == "Ready"
    ).items()
    assert handle.endpoint == {"host": pod["status"]["podIP"], "port": 8701}
    assert handle.cell == {"namespace": NAMESPACE, "pod": sandbox_id, "manager": "mgr-a"}
    assert backend.owns(handle.cell)
    assert watches(cluster, sandbox_id)[0]["resourceVersion"] == ["1"]  # the create's version

    session = tokens.generate_p256()
    await initialize(handle.endpoint, BOOTSTRAP, sandbox_id, session, {"A": "1"}, 10)
    with DaemonClient(handle.endpoint, sandbox_id, session) as client:
        result = client.exec("echo $A $(id -u); env | grep -c SANDCELL_ || true")
    assert result["stdout"] == "1 1000\n0\n"

    assert await backend.healthy(handle.endpoint)
    await backend.destroy(handle.cell)
    await backend.destroy(handle.cell)  # idempotent: a 404 is what we wanted
    await until(lambda: cluster.pod(sandbox_id) is None)
    assert not await backend.healthy(handle.endpoint)
    assert cluster.running_processes() == set()


async def test_dropped_watch_and_410_gone_are_survived(cluster, make_backend):
    """The pod is held Pending (no node) while its watch is cut, then its version expires."""
    backend = make_backend()
    sandbox_id = new_id()
    cluster.call(cluster.kubelet.set_schedulable, False)
    create = asyncio.ensure_future(backend.create(POLICY, sandbox_id, tokens.public_pem(BOOTSTRAP)))
    await until(lambda: len(watches(cluster, sandbox_id)) == 1)
    cluster.call(cluster.registry.drop_watches)  # mid-stream: the connection just ends
    await until(lambda: len(watches(cluster, sandbox_id)) == 2)
    cluster.call(cluster.registry.compact)
    cluster.call(cluster.registry.drop_watches)
    await until(lambda: len(watches(cluster, sandbox_id)) >= 4)
    cluster.call(cluster.kubelet.set_schedulable, True)
    handle = await create

    first, resumed, expired, fresh = watches(cluster, sandbox_id)[:4]
    assert int(resumed["resourceVersion"][0]) >= int(first["resourceVersion"][0])
    assert "resourceVersion" in expired  # answered 410 Expired: too old after the compaction
    assert "resourceVersion" not in fresh  # so lightkube restarts from the current state
    assert await backend.healthy(handle.endpoint)
    await backend.destroy(handle.cell)


async def test_unschedulable_pod_times_out_and_is_deleted(cluster, make_backend):
    backend = make_backend(ready_timeout_s=1.5)
    cluster.call(cluster.kubelet.set_schedulable, False)
    sandbox_id = new_id()
    with pytest.raises(ServiceError) as info:
        await backend.create(POLICY, sandbox_id, tokens.public_pem(BOOTSTRAP))
    assert info.value.status == 503 and "Unschedulable" in info.value.message
    assert cluster.pods() == []


async def test_daemon_that_cannot_start_fails_fast(cluster, make_backend):
    backend = make_backend()
    sandbox_id = new_id()
    with pytest.raises(ServiceError) as info:
        await backend.create(POLICY, sandbox_id, b"not a PEM key")
    assert info.value.status == 503 and "Failed" in info.value.message
    await until(lambda: cluster.pods() == [])


@pytest.mark.parametrize(("method", "code"), [("POST", 500), ("POST", 429), ("GET", 500)])
async def test_api_errors_fail_cleanly(cluster, make_backend, method, code):
    backend = make_backend()
    cluster.call(cluster.registry.fail_next, method, code)
    with pytest.raises(ServiceError) as info:
        await backend.create(POLICY, new_id(), tokens.public_pem(BOOTSTRAP))
    assert info.value.status == 503 and str(code) in info.value.message
    await until(lambda: cluster.pods() == [])


async def test_a_failed_cleanup_does_not_hide_the_cause(cluster, make_backend):
    backend = make_backend()
    sandbox_id = new_id()
    cluster.call(cluster.registry.fail_next, "GET", 403)  # the watch is refused...
    cluster.call(cluster.registry.fail_next, "DELETE", 503)  # ...and so is the cleanup
    with pytest.raises(ServiceError) as info:
        await backend.create(POLICY, sandbox_id, tokens.public_pem(BOOTSTRAP))
    assert "403" in info.value.message
    assert cluster.pod(sandbox_id) is not None  # left to its deadline, or reconciliation
    await backend.destroy({"namespace": NAMESPACE, "pod": sandbox_id})


async def test_name_conflict_leaves_the_other_pod_alone(cluster, make_backend):
    backend = make_backend()
    sandbox_id = new_id()
    first = await backend.create(POLICY, sandbox_id, tokens.public_pem(BOOTSTRAP))
    with pytest.raises(ServiceError) as info:
        await backend.create(POLICY, sandbox_id, tokens.public_pem(BOOTSTRAP))
    assert "409" in info.value.message and "already exists" in info.value.message
    assert cluster.pod(sandbox_id) is not None and await backend.healthy(first.endpoint)
    await backend.destroy(first.cell)


async def test_cancelled_create_leaves_no_pod(cluster, make_backend):
    backend = make_backend()
    cluster.call(cluster.kubelet.set_schedulable, False)
    sandbox_id = new_id()
    create = asyncio.ensure_future(backend.create(POLICY, sandbox_id, tokens.public_pem(BOOTSTRAP)))
    await until(lambda: cluster.pod(sandbox_id) is not None)
    create.cancel()
    with pytest.raises(asyncio.CancelledError):
        await create
    await until(lambda: cluster.pods() == [])


@pytest.mark.slow
async def test_active_deadline_ends_the_pod(cluster, make_backend):
    backend = make_backend({"short": {"max_lifetime_s": 3}}, max_pool_wait_s=0)
    policy = Template(**SMALL).policy()
    sandbox_id = new_id()
    handle = await backend.create(policy, sandbox_id, tokens.public_pem(BOOTSTRAP))
    assert cluster.pod(sandbox_id)["spec"]["activeDeadlineSeconds"] == 3
    await until(lambda: cluster.pod(sandbox_id)["status"]["phase"] == "Failed")
    assert cluster.pod(sandbox_id)["status"]["reason"] == "DeadlineExceeded"
    assert not await backend.healthy(handle.endpoint)
    assert await backend.list() == []  # an ended pod is deleted, never adopted
    await until(lambda: cluster.pods() == [])


async def test_list_sees_only_this_managers_live_pods(cluster, make_backend, tmp_path):
    mine = make_backend()
    # Another replica, configured through a kubeconfig file (whose namespace is overridden).
    theirs = make_backend(
        api_server=None,
        kubeconfig=str(kubeconfig_for(cluster, tmp_path / "kubeconfig")),
        context="fake",
        manager_id="mgr-b",
    )
    pem = tokens.public_pem(BOOTSTRAP)
    a, b = new_id(), new_id()
    handle_a = await mine.create(POLICY, a, pem)
    handle_b = await theirs.create(POLICY, b, pem)
    assert not mine.owns(handle_b.cell) and theirs.owns(handle_b.cell)
    # A half-created pod of this manager (never scheduled, so it has no IP): deleted by list.
    cluster.call(cluster.kubelet.set_schedulable, False)
    stuck = new_id()
    pending = asyncio.ensure_future(mine.create(POLICY, stuck, pem))
    await until(lambda: cluster.pod(stuck) is not None)

    assert await mine.list() == [handle_a]
    assert await theirs.list() == [handle_b]
    assert cluster.pod(stuck) is None
    with pytest.raises(ServiceError):
        await pending
    await mine.destroy(handle_a.cell)
    assert await mine.list() == []  # a terminating pod is not listed
    await theirs.destroy(handle_b.cell)


async def test_unknown_policy_is_refused(make_backend):
    backend: KubernetesBackend = make_backend()
    other = Template(**{**SMALL, "memory_mb": 999}).policy()
    with pytest.raises(ValueError, match="no configured template"):
        await backend.create(other, new_id(), tokens.public_pem(BOOTSTRAP))


async def test_fake_refuses_a_root_pod(cluster):
    """The fake node enforces runAsNonRoot as a kubelet does (so the backend's is checked)."""
    pod = {
        "metadata": {"name": "rooty"},
        "spec": {
            "securityContext": {"runAsNonRoot": True},
            "containers": [{"name": "d", "image": "i", "command": ["sandcell", "daemon"]}],
        },
    }
    async with httpx.AsyncClient(base_url=cluster.url) as client:
        r = await client.post(f"/api/v1/namespaces/{NAMESPACE}/pods", json=pod)
        assert r.status_code == 201
    await until(lambda: cluster.pod("rooty")["status"]["phase"] == "Failed")
    assert "runAsNonRoot" in cluster.pod("rooty")["status"]["message"]


@pytest.mark.slow
async def test_an_image_template_runs_the_daemon_injected_by_the_init_container(
    cluster, make_backend
):
    """The fake node runs the init container for real (it copies this host's runtime into
    the pod's volume) and then the daemon from that copy: its own loader, libraries and
    interpreter, isolated from PYTHON* variables (SPEC §12)."""
    image = {"base": "debian:bookworm", "oci": "registry.example/data:2"}
    backend = make_backend({"data": {"image": image}})
    policy = Template(**SMALL, image=image).policy()
    sandbox_id = new_id()
    handle = await backend.create(policy, sandbox_id, tokens.public_pem(BOOTSTRAP))
    pod = cluster.pod(sandbox_id)
    assert pod is not None and pod["spec"]["containers"][0]["image"] == image["oci"]
    session = tokens.generate_p256()
    await initialize(handle.endpoint, BOOTSTRAP, sandbox_id, session, {}, 10)
    with DaemonClient(handle.endpoint, sandbox_id, session) as client:
        result = client.exec("cat /proc/$PPID/cmdline | tr '\\0' ' '")
    assert "/lib/ld.so --library-path" in result["stdout"], result
    assert "sandcell.daemon" in result["stdout"]
    await backend.destroy(handle.cell)
    await until(lambda: cluster.pod(sandbox_id) is None)
