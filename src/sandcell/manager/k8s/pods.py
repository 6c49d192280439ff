"""A template's cell as a Pod manifest: limits, hardening, lifetime bound and labels."""

from __future__ import annotations

from typing import Any

from sandcell.cellapi.argv import daemon_args
from sandcell.cellapi.layout import WORKSPACE_ALIASES
from sandcell.isolation.images.inject import RUNTIME_MOUNT, daemon_command
from sandcell.isolation.policy import CellPolicy
from sandcell.manager.k8s.config import KubernetesConfig

CONTAINER = "daemon"
WORKSPACE = "/workspace"
# Labels: the NetworkPolicy selects on NAME; list() on MANAGED_BY + MANAGER; TEMPLATE names
# the pool a warm pod belongs to.
NAME, SANDBOX_POD = "app.kubernetes.io/name", "sandcell-sandbox"
MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "sandcell.dev/manager"
TEMPLATE = "sandcell.dev/template"
SANDBOX = "sandcell.dev/sandbox"
STOP_GRACE_S = 1  # nothing in a sandbox is worth waiting for once it is deleted


HARDENED = {
    "allowPrivilegeEscalation": False,
    "privileged": False,
    "readOnlyRootFilesystem": True,
    "runAsNonRoot": True,
    "capabilities": {"drop": ["ALL"]},
}
RUNTIME_VOLUME = "sandcell-runtime"
RUNTIME_COPY = "/sandcell-runtime"  # where the init container writes the volume


def _daemon_container(
    config: KubernetesConfig, policy: CellPolicy
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The daemon container's image and command, and the init container a template image
    needs: sandcell's daemon image copies its runtime into a volume that the template's
    image mounts read-only (SPEC §12), so the daemon runs on any image."""
    args = daemon_args(
        listen=f"0.0.0.0:{config.daemon_port}",
        disk_quota_mb=policy.disk_mb,
        inherit_env=policy.inherit_env,
        code_python=policy.code_python,
    )
    pull = {"imagePullPolicy": config.image_pull_policy}
    if policy.pod_image is None:
        return {
            "name": CONTAINER,
            "image": config.image,
            **pull,
            "command": ["sandcell", "daemon", *args],
        }, None
    container = {
        "name": CONTAINER,
        "image": policy.pod_image,
        **pull,
        "command": [*daemon_command(RUNTIME_MOUNT), "-m", "sandcell.daemon", *args],
        "volumeMounts": [{"name": RUNTIME_VOLUME, "mountPath": RUNTIME_MOUNT, "readOnly": True}],
    }
    init = {
        "name": "sandcell-runtime",
        "image": config.image,
        **pull,
        "command": ["python", "-m", "sandcell.isolation.images.inject", RUNTIME_COPY],
        "securityContext": HARDENED,
        "resources": {"requests": INIT_RESOURCES, "limits": INIT_RESOURCES},
        "volumeMounts": [{"name": RUNTIME_VOLUME, "mountPath": RUNTIME_COPY}],
    }
    return container, init


INIT_RESOURCES = {"cpu": "500m", "memory": "256Mi", "ephemeral-storage": "64Mi"}


def owner_labels(config: KubernetesConfig) -> dict[str, str]:
    return {MANAGED_BY: "sandcell", MANAGER: config.manager_id}


def pod_manifest(
    config: KubernetesConfig,
    policy: CellPolicy,
    *,
    sandbox_id: str,
    bootstrap_pem: bytes,
    template: str,
    deadline_s: int,
) -> dict[str, Any]:
    """The pod runs only the daemon, as a non-root user with no capabilities and a read-only
    root; its environment holds the sandbox id and the bootstrap public key, nothing else."""
    container, init = _daemon_container(config, policy)
    resources = {
        "cpu": f"{max(1, round(policy.cpus * 1000))}m",
        "memory": f"{policy.memory_mb}Mi",
        "ephemeral-storage": f"{policy.disk_mb}Mi",
    }
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "activeDeadlineSeconds": deadline_s,
        "terminationGracePeriodSeconds": STOP_GRACE_S,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,  # else every Service of the namespace lands in the env
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 1000,
            "runAsGroup": 1000,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [
            {
                **container,
                "env": [
                    {"name": "SANDCELL_SANDBOX_ID", "value": sandbox_id},
                    {"name": "SANDCELL_BOOTSTRAP_PUBLIC_KEY", "value": bootstrap_pem.decode()},
                    {"name": "SANDCELL_WORKSPACE", "value": WORKSPACE},
                ],
                "ports": [{"name": "daemon", "containerPort": config.daemon_port}],
                "readinessProbe": {
                    "httpGet": {"path": "/health", "port": "daemon"},
                    "periodSeconds": 1,
                    "timeoutSeconds": 1,
                },
                "resources": {"requests": resources, "limits": resources},
                "securityContext": HARDENED,
                "volumeMounts": [
                    {"name": "workspace", "mountPath": WORKSPACE},
                    # The same directory at E2B's home too, as in local cells (cellapi.layout).
                    *({"name": "workspace", "mountPath": a} for a in WORKSPACE_ALIASES),
                    {"name": "tmp", "mountPath": "/tmp"},  # noqa: S108 - the pod's own tmpfs
                    *container.get("volumeMounts", []),
                ],
            }
        ],
        "volumes": [
            {"name": "workspace", "emptyDir": {"sizeLimit": f"{policy.disk_mb}Mi"}},
            # Memory-backed, so it counts against (and stays below) the memory limit.
            {
                "name": "tmp",
                "emptyDir": {
                    "medium": "Memory",
                    "sizeLimit": f"{max(16, policy.memory_mb // 4)}Mi",
                },
            },
        ],
    }
    if init:
        spec["initContainers"] = [init]
        spec["volumes"].append({"name": RUNTIME_VOLUME, "emptyDir": {"sizeLimit": "512Mi"}})
    if config.runtime_class:
        spec["runtimeClassName"] = config.runtime_class
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": sandbox_id,
            "namespace": config.namespace,
            "labels": {
                NAME: SANDBOX_POD,
                **owner_labels(config),
                TEMPLATE: template,
                SANDBOX: sandbox_id,
            },
        },
        "spec": spec,
    }
