"""Cells as Pods, through the Kubernetes API (lightkube, async, over HTTP)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator
from typing import Any, NoReturn, cast

import httpx2
import lightkube
from lightkube import ApiError, AsyncClient, KubeConfig, SingleConfig
from lightkube.config.models import Cluster, User
from lightkube.core.client import LabelSelector
from lightkube.resources.core_v1 import Pod
from lightkube.types import OnErrorAction, OnErrorResult

from sandcell.cellapi import health
from sandcell.errors import ErrorCode, ServiceError
from sandcell.isolation.policy import CellPolicy
from sandcell.isolation.usage import CellUsage
from sandcell.manager.backend import CellHandle
from sandcell.manager.k8s.config import KubernetesConfig
from sandcell.manager.k8s.pods import STOP_GRACE_S, owner_labels, pod_manifest
from sandcell.manager.templates import ConfigError, Template

log = logging.getLogger("sandcell.manager.k8s")

WATCH_RETRIES = 5
TERMINAL_PHASES = ("Failed", "Succeeded")


class PodFailed(Exception):
    """The pod will never serve: it failed, was deleted, or was not ready in time."""


def client_config(config: KubernetesConfig) -> SingleConfig:
    if config.api_server:  # anonymous (lightkube's from_server lacks the user it asserts)
        one = KubeConfig.from_one(cluster=Cluster(server=config.api_server), user=User())
        return _context(one, None)
    try:
        # In-cluster service account first, then $KUBECONFIG, then ~/.kube/config.
        found = (
            KubeConfig.from_file(config.kubeconfig) if config.kubeconfig else KubeConfig.from_env()
        )
        return _context(found, config.context)
    except lightkube.ConfigError as exc:
        raise ConfigError(f"[kubernetes]: no usable cluster configuration: {exc}") from None


def _context(kubeconfig: KubeConfig, name: str | None) -> SingleConfig:
    # `get` returns None only as the `default` it is given (none here): without a context
    # to use it raises ConfigError.
    return cast(SingleConfig, kubeconfig.get(name))


def resume_watch(exc: Exception, attempt: int) -> OnErrorResult:
    """A dropped watch resumes from the last version seen; 410 Gone (that version is too old)
    restarts it from the current state (lightkube does both). Other errors, or too many
    failures in a row, are raised."""
    gone = isinstance(exc, ApiError) and exc.status.code == 410
    if (gone or isinstance(exc, httpx2.TransportError)) and attempt <= WATCH_RETRIES:
        return OnErrorResult(OnErrorAction.RETRY, sleep=min(0.05 * 2**attempt, 2.0))
    return OnErrorResult(OnErrorAction.RAISE)


def is_ready(pod: Pod) -> bool:
    status = pod.status
    if status is None or status.phase != "Running" or not status.podIP:
        return False
    return any(c.type == "Ready" and c.status == "True" for c in status.conditions or ())


def describe(pod: Pod) -> str:
    """Why a pod is where it is, e.g. "Pending; Unschedulable: 0/3 nodes are available"."""
    status = pod.status
    if status is None:
        return "no status yet"
    why = [status.phase or "Unknown", _said(status.reason, status.message)]
    why += [_said(c.reason, c.message) for c in status.conditions or () if c.status != "True"]
    for c in status.containerStatuses or ():
        if c.state and c.state.waiting:
            why.append(
                f"{c.name} waiting: {_said(c.state.waiting.reason, c.state.waiting.message)}"
            )
        if c.state and c.state.terminated:
            done = c.state.terminated
            why.append(f"{c.name} terminated: {done.reason} (exit {done.exitCode})")
    return "; ".join(dict.fromkeys(w for w in why if w))


def _said(reason: str | None, message: str | None) -> str:
    return ": ".join(p for p in (reason, message) if p)


class KubernetesBackend:
    """Each cell is a Pod in one namespace; the daemon listens on `daemon_port` at the pod IP.

    Pods carry this manager's name as a label, so that after a restart it lists (and
    reconciles) only its own; a StatefulSet keeps that name stable.
    """

    name = "kubernetes"

    def __init__(
        self,
        config: KubernetesConfig,
        templates: dict[str, Template],
        client: AsyncClient | None = None,
    ) -> None:
        self.config = config
        self.client = client or AsyncClient(client_config(config), namespace=config.namespace)
        # `create` receives a template's policy only: find the template's name (for the pool
        # label) and lifetime (for the pod's deadline) from it. Templates with equal
        # policies share pods of one shape, labelled with the first one's name.
        self._shapes: dict[CellPolicy, tuple[str, int]] = {}
        for name, template in templates.items():
            label, deadline = self._shapes.get(template.policy(), (name, 0))
            lifetime = template.max_lifetime_s + config.max_pool_wait_s
            self._shapes[template.policy()] = (label, max(deadline, lifetime))

    def owns(self, cell: dict[str, Any]) -> bool:
        return (
            cell.get("manager") == self.config.manager_id
            and cell.get("namespace") == self.config.namespace
        )

    def _handle(self, pod: Pod) -> CellHandle:
        assert pod.metadata is not None and pod.status is not None
        return CellHandle(
            {"host": pod.status.podIP, "port": self.config.daemon_port},
            {
                "namespace": self.config.namespace,
                "pod": pod.metadata.name,
                "manager": self.config.manager_id,
            },
        )

    async def create(
        self,
        policy: CellPolicy,
        sandbox_id: str,
        bootstrap_pem: bytes,
        workspace: str | None = None,
    ) -> CellHandle:
        if policy not in self._shapes:
            raise ValueError("no configured template has this policy")
        template, deadline = self._shapes[policy]
        manifest = pod_manifest(
            self.config,
            policy,
            sandbox_id=sandbox_id,
            bootstrap_pem=bootstrap_pem,
            template=template,
            deadline_s=deadline,
        )
        refused = False
        try:
            try:
                # `from_dict` decodes into the class it is called on (lightkube annotates the
                # mixin's classmethod as returning its base).
                created = await self.client.create(cast(Pod, Pod.from_dict(manifest)))
            except ApiError:
                refused = True  # nothing was made (and a 409's pod is not ours to delete)
                raise
            ready = await self._until_ready(created)
        except BaseException as exc:
            if not refused:  # a lost answer included: leave no pod behind, even if cancelled
                await self._discard(sandbox_id)
            if isinstance(exc, PodFailed | httpx2.HTTPError):  # ApiError included
                raise ServiceError(
                    ErrorCode.OVERLOADED,
                    f"no pod could be started for the sandbox: {_reason(exc)}",
                    {"backend": self.name, "pod": sandbox_id},
                ) from exc
            raise
        return self._handle(ready)

    async def _until_ready(self, created: Pod) -> Pod:
        """The readiness gate: return once the pod is Running and Ready (its daemon answers
        the readiness probe), watching from the version the create returned."""
        assert created.metadata is not None and created.metadata.name is not None
        name, seen = created.metadata.name, created
        # lightkube annotates `watch` as an AsyncIterable; it is an async generator (closed here).
        watch = cast(
            AsyncGenerator[tuple[str, Pod], None],
            self.client.watch(
                Pod,
                namespace=self.config.namespace,
                fields={"metadata.name": name},
                resource_version=created.metadata.resourceVersion,
                on_error=resume_watch,
            ),
        )
        try:
            async with asyncio.timeout(self.config.ready_timeout_s), contextlib.aclosing(watch):
                async for event, pod in watch:
                    seen = pod
                    if event == "DELETED":
                        raise PodFailed(f"pod {name} was deleted: {describe(pod)}")
                    if is_ready(pod):
                        return pod
                    if pod.status is not None and pod.status.phase in TERMINAL_PHASES:
                        raise PodFailed(f"pod {name} ended: {describe(pod)}")
        except TimeoutError:
            raise PodFailed(
                f"pod {name} not ready after {self.config.ready_timeout_s:g} s: {describe(seen)}"
            ) from None
        raise PodFailed(f"the watch of pod {name} ended")  # lightkube reconnects: unreachable

    async def _delete(self, namespace: str, name: str) -> None:
        try:
            await self.client.delete(Pod, name, namespace=namespace, grace_period=STOP_GRACE_S)
        except ApiError as exc:
            if exc.status.code != 404:  # gone already is what we wanted
                raise

    async def _discard(self, name: str) -> None:
        """Best effort after a failed create: a pod left behind still ends at its deadline,
        or at this manager's next reconciliation."""
        try:
            await asyncio.shield(self._delete(self.config.namespace, name))
        except httpx2.HTTPError as exc:
            log.warning("could not delete pod %s: %s", name, exc)

    async def stop(self, cell: dict[str, Any]) -> None:
        """The pod's deletion: the API server marks it at once, the kubelet kills it."""
        await self.destroy(cell)

    async def destroy(self, cell: dict[str, Any]) -> None:
        await self._delete(str(cell["namespace"]), str(cell["pod"]))

    async def list(self) -> list[CellHandle]:
        """This manager's pods; those that can never serve (ended, or without an IP: never
        started, half-created before a crash) are deleted here, as nothing can adopt them."""
        handles = []
        labels: LabelSelector = {**owner_labels(self.config)}
        pods = self.client.list(Pod, namespace=self.config.namespace, labels=labels)
        async for pod in pods:
            assert pod.metadata is not None and pod.metadata.name is not None
            if pod.metadata.deletionTimestamp is not None:
                continue
            if pod.status and pod.status.podIP and pod.status.phase not in TERMINAL_PHASES:
                handles.append(self._handle(pod))
            else:
                log.info("deleting pod %s: %s", pod.metadata.name, describe(pod))
                await self._delete(self.config.namespace, pod.metadata.name)
        return handles

    async def healthy(self, endpoint: dict[str, Any]) -> bool:
        return await health.probe(endpoint)

    async def adopt(self, sandbox_id: str, handle: CellHandle) -> None:
        """Nothing to reattach: a pod's egress goes through the shared egress service."""

    async def cell_trust(self, sandbox_id: str) -> dict[str, str]:
        """Pods get no CA bundle and no substituting proxy yet (docs/kubernetes.md): a
        sandbox with secrets is refused by name, before any pod is made or claimed."""
        raise ServiceError(
            ErrorCode.NOT_IMPLEMENTED,
            "`secrets` cannot take effect on the kubernetes backend yet (pods get no "
            "substituting proxy): create the sandbox without `secrets`, or on the local backend",
            {"field": "secrets", "backend": self.name},
        )

    async def usage(self, cell: dict[str, Any]) -> CellUsage:
        """Pods are accounted by the kubelet (metrics.k8s.io), which a manager may not be
        allowed to read; sandcell does not guess from inside the pod (docs/kubernetes.md)."""
        raise ServiceError(
            ErrorCode.NOT_IMPLEMENTED,
            "sandbox metrics are not available on the Kubernetes backend; "
            "use the cluster's metrics (kubectl top pod)",
            {"backend": self.name, "pod": cell.get("pod")},
        )

    def _not_yet(self, subject: str) -> NoReturn:
        """Pods keep no workspace past their end yet (PersistentVolumeClaims and
        VolumeSnapshots would): docs/kubernetes.md says so."""
        raise ServiceError(
            ErrorCode.NOT_IMPLEMENTED,
            "pause, resume and snapshots are not available on the Kubernetes backend yet",
            {"backend": self.name, "subject": subject},
        )

    def workspace_home(self, sandbox_id: str) -> str:
        self._not_yet(sandbox_id)

    async def keep_workspace(self, cell: dict[str, Any], home: str) -> None:
        self._not_yet(home)

    async def discard_workspace(self, home: str) -> None:
        """Nothing is ever kept (see `_not_yet`)."""

    def snapshot_path(self, snapshot_id: str) -> str:
        self._not_yet(snapshot_id)

    async def workspace_bytes(self, cell: dict[str, Any] | None, home: str) -> int:
        self._not_yet(home)

    async def copy_workspace(self, cell: dict[str, Any] | None, home: str, dest: str) -> int:
        self._not_yet(dest)

    async def thaw(self, cell: dict[str, Any]) -> None:
        """Pods are never frozen."""

    async def aclose(self) -> None:
        await self.client.aclose()


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ApiError):
        return f"the API server answered {exc.status.code}: {exc.status.message}"
    return str(exc) or type(exc).__name__
