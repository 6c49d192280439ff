"""The deployment manifests and the backend's pod, validated offline.

`kubectl kustomize` renders deploy/kubernetes (no cluster needed); every object is checked
against the Kubernetes OpenAPI schemas bundled by kubernetes-validate, in strict mode (an
unknown or misspelt field fails), for the oldest and newest versions supported; then what
the objects mean together is checked: RBAC scope, network policies, secrets, Pod Security.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from sandcell.manager.k8s.config import KubernetesConfig
from sandcell.manager.k8s.pods import pod_manifest
from sandcell.manager.templates import Template
from sandcell.settings import load_settings

from .podsecurity import restricted_violations

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
VERSIONS = ("1.29", "1.37")
CONTROL_PLANE = {
    "app.kubernetes.io/name": "sandcell",
    "app.kubernetes.io/component": "control-plane",
}


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl (with its built-in kustomize) renders the manifests"
    out = subprocess.run(
        [kubectl, "kustomize", str(DEPLOY / "kubernetes")],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def one(docs: list[dict], kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def pod_specs(docs: list[dict]) -> list[dict[str, Any]]:
    return [d["spec"]["template"]["spec"] for d in docs if d["kind"] == "StatefulSet"]


def settings_of(docs: list[dict], tmp_path: Path):
    (config_map,) = [d for d in docs if d["kind"] == "ConfigMap"]
    path = tmp_path / "sandcell.toml"
    path.write_text(config_map["data"]["sandcell.toml"])
    return load_settings(path, tmp_path)


@pytest.mark.parametrize("version", VERSIONS)
def test_every_object_is_schema_valid(rendered, version):
    for doc in rendered:
        kubernetes_validate.validate(doc, version, strict=True)


def test_strict_validation_catches_a_misspelt_field(rendered):
    statefulset = one(rendered, "StatefulSet", "sandcell")
    statefulset["spec"]["template"]["spec"]["containers"][0]["securityContex"] = {}
    with pytest.raises(kubernetes_validate.ValidationError, match="securityContex"):
        kubernetes_validate.validate(statefulset, VERSIONS[-1], strict=True)


def test_the_expected_objects(rendered):
    def named(d: dict) -> tuple[str, str, str]:
        name = d["metadata"]["name"]
        if d["kind"] == "ConfigMap":  # generated: a hash of the content is appended
            name = re.sub(r"-[a-z0-9]{10}$", "-HASH", name)
        return d["kind"], d["metadata"].get("namespace", ""), name

    assert sorted(named(d) for d in rendered) == [
        ("ConfigMap", "sandcell", "sandcell-config-HASH"),
        ("Namespace", "", "sandcell"),
        ("Namespace", "", "sandcell-sandboxes"),
        ("NetworkPolicy", "sandcell", "sandcell-valkey"),
        ("NetworkPolicy", "sandcell-sandboxes", "sandboxes"),
        ("Role", "sandcell-sandboxes", "sandcell-pods"),
        ("RoleBinding", "sandcell-sandboxes", "sandcell-pods"),
        ("Service", "sandcell", "sandcell"),
        ("Service", "sandcell", "sandcell-replicas"),
        ("Service", "sandcell", "sandcell-valkey"),
        ("ServiceAccount", "sandcell", "sandcell"),
        ("StatefulSet", "sandcell", "sandcell"),
        ("StatefulSet", "sandcell", "sandcell-valkey"),
    ]


def test_control_plane_replicas_config_and_store_key(rendered, tmp_path):
    statefulset = one(rendered, "StatefulSet", "sandcell")
    assert statefulset["spec"]["replicas"] >= 2
    pod = statefulset["spec"]["template"]
    assert pod["metadata"]["labels"] == CONTROL_PLANE
    (container,) = pod["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["SANDCELL_STORE_KEY"]["valueFrom"] == {
        "secretKeyRef": {"name": "sandcell-store-key", "key": "store-key"}
    }
    assert env["SANDCELL_MANAGER_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert not [d for d in rendered if d["kind"] == "Secret"]  # the key is never in the files
    (config_map,) = [d for d in rendered if d["kind"] == "ConfigMap"]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["config"]["configMap"]["name"] == config_map["metadata"]["name"]

    settings = settings_of(rendered, tmp_path)
    assert settings.backend == "kubernetes"
    valkey = one(rendered, "Service", "sandcell-valkey")
    assert settings.store_url == f"redis://{valkey['metadata']['name']}.sandcell.svc:6379/0"
    assert settings.templates["default"].warm_pool >= 1


def test_rbac_allows_pods_in_the_sandbox_namespace_only(rendered, tmp_path):
    sandboxes = settings_of(rendered, tmp_path).kubernetes.namespace
    assert not [d for d in rendered if d["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    role = one(rendered, "Role", "sandcell-pods")
    assert role["metadata"]["namespace"] == sandboxes
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["pods"],
            "verbs": ["get", "list", "watch", "create", "delete"],
        }
    ]
    binding = one(rendered, "RoleBinding", "sandcell-pods")
    account = one(rendered, "StatefulSet", "sandcell")["spec"]["template"]["spec"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["serviceAccountName"], "namespace": "sandcell"}
    ]


def test_network_policies(rendered, tmp_path):
    config = settings_of(rendered, tmp_path).kubernetes
    policy = one(rendered, "NetworkPolicy", "sandboxes")
    assert policy["metadata"]["namespace"] == config.namespace
    spec = policy["spec"]
    assert spec["podSelector"] == {} and spec["policyTypes"] == ["Ingress", "Egress"]
    assert spec["egress"] == []  # no egress at all
    (rule,) = spec["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": config.daemon_port}]
    (peer,) = rule["from"]  # one peer with both selectors: those pods of that namespace only
    assert peer["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "sandcell"}
    assert peer["podSelector"]["matchLabels"] == CONTROL_PLANE

    store = one(rendered, "NetworkPolicy", "sandcell-valkey")["spec"]
    valkey = one(rendered, "StatefulSet", "sandcell-valkey")["spec"]["template"]["metadata"]
    assert store["podSelector"]["matchLabels"] == valkey["labels"]
    assert store["egress"] == []
    assert [p["podSelector"]["matchLabels"] for p in store["ingress"][0]["from"]] == [CONTROL_PLANE]


def test_pods_meet_the_restricted_pod_security_standard(rendered):
    namespaces = [d for d in rendered if d["kind"] == "Namespace"]
    assert all(
        n["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
        for n in namespaces
    )
    for spec in pod_specs(rendered):
        assert restricted_violations(spec) == []
        for c in spec["containers"]:
            assert c["securityContext"]["readOnlyRootFilesystem"] is True


def test_the_backends_pod_is_valid_and_restricted():
    config = KubernetesConfig(runtime_class="gvisor", manager_id="sandcell-0")
    template = Template(memory_mb=768, cpus=1.5, disk_mb=2048, max_lifetime_s=900)
    pod = pod_manifest(
        config,
        template.policy(),
        sandbox_id="sbx-0123456789abcdef",
        bootstrap_pem=b"-----BEGIN PUBLIC KEY-----\n...\n-----END PUBLIC KEY-----\n",
        template="default",
        deadline_s=900,
    )
    for version in VERSIONS:
        kubernetes_validate.validate(pod, version, strict=True)
    assert restricted_violations(pod["spec"]) == []
    (container,) = pod["spec"]["containers"]
    limits = {"cpu": "1500m", "memory": "768Mi", "ephemeral-storage": "2048Mi"}
    assert container["resources"] == {"requests": limits, "limits": limits}
    assert pod["spec"]["runtimeClassName"] == "gvisor"


@pytest.mark.parametrize("name", ["Dockerfile.daemon", "Dockerfile.server"])
def test_images_are_non_root_and_hold_no_secret(name):
    lines = [line.strip() for line in (DEPLOY / name).read_text().replace("\\\n", " ").splitlines()]
    (user,) = [line for line in lines if line.startswith("USER ")]
    assert user == "USER 1000:1000"
    env = " ".join(line for line in lines if line.startswith("ENV "))
    assert env and not re.search("KEY|SECRET|TOKEN|PASSWORD", env)
    for line in lines:  # what it copies from the repository exists
        if line.startswith("COPY ") and "--from" not in line:
            for source in line.split()[1:-1]:
                assert (ROOT / source).exists(), source


def test_an_image_templates_pod_injects_the_daemon_and_stays_restricted():
    """`image.oci` is the pod's image; the daemon comes from an init container of sandcell's
    daemon image, through a volume the daemon container mounts read-only (SPEC §12)."""
    config = KubernetesConfig(image="registry.example/sandcell-daemon:1", manager_id="m-0")
    template = Template(image={"base": "debian:bookworm", "oci": "registry.example/data:2"})
    pod = pod_manifest(
        config,
        template.policy(),
        sandbox_id="sbx-0123456789abcdef",
        bootstrap_pem=b"-----BEGIN PUBLIC KEY-----\n...\n-----END PUBLIC KEY-----\n",
        template="data",
        deadline_s=900,
    )
    for version in VERSIONS:
        kubernetes_validate.validate(pod, version, strict=True)
    assert restricted_violations(pod["spec"]) == []
    (container,) = pod["spec"]["containers"]
    (init,) = pod["spec"]["initContainers"]
    assert container["image"] == "registry.example/data:2"
    assert init["image"] == "registry.example/sandcell-daemon:1"
    runtime = next(m for m in container["volumeMounts"] if m["name"] == "sandcell-runtime")
    assert runtime["readOnly"] is True and container["command"][0].startswith(runtime["mountPath"])
    assert init["securityContext"]["readOnlyRootFilesystem"] is True
