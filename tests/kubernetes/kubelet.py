"""The fake node: runs each pod's daemon as a real process, the way a kubelet would.

A pod is scheduled at once (unless the node is made unschedulable), gets its own loopback IP
(127.N.x.y), and its one container runs in a cgroup of its own with the pod's memory and CPU
limits, as the pod's runAsUser/runAsGroup with no_new_privs and no capabilities (when the
tests run as root), with exactly the environment the spec declares. The readiness probe the
spec declares is run against the pod IP; activeDeadlineSeconds fails the pod; deletion sends
SIGTERM, then kills every process of the pod after the grace period.

The only translations from a real node, since there is no image and no network namespace:
- the image is this checkout: `sandcell daemon ARGS` runs as `python -m sandcell.daemon ARGS`,
  `python -m MODULE ARGS` with this interpreter; a command inside a volume (the daemon
  runtime an init container copied there, SPEC §12) runs from that volume's directory, on
  the host's root (any other command fails the container with StartError);
- init containers run to completion, in order, before the container starts;
- a listen address `0.0.0.0:PORT` in the arguments is narrowed to `POD_IP:PORT`;
- an emptyDir is a host directory, and an env value naming a mount path names that directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import random
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from sandcell.isolation import cgroups

from .apiserver import Key, PodRegistry, now_rfc3339

PIDS_MAX = 4096  # a kubelet's podPidsLimit
SETPRIV = shutil.which("setpriv") or "/usr/bin/setpriv"  # the container gets no PATH
TICK_S = 0.05
_QUANTITY = re.compile(r"^(\d+(?:\.\d+)?)(m|Ki|Mi|Gi|k|M|G)?$")
_SCALE = {
    None: 1,
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "Ki": 1024,
    "Mi": 1024**2,
    "Gi": 1024**3,
}


class ContainerError(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def quantity(value: str) -> float:
    m = _QUANTITY.match(str(value))
    if not m:
        raise ContainerError("CreateContainerConfigError", f"bad quantity {value!r}")
    return float(m[1]) * _SCALE[m[2]]


@dataclass
class Container:
    proc: subprocess.Popen[bytes]
    cgroup: cgroups.CellCgroup
    started: float

    def kill(self) -> None:
        """Every process of the pod, forks included (blocking: run in a thread)."""
        self.cgroup.destroy()
        self.proc.wait()


class Kubelet:
    def __init__(self, registry: PodRegistry, root: Path, cgroup_parent: str) -> None:
        self.registry = registry
        self.root = root
        self.cgroups = cgroups.detect(cgroup_parent)
        self.schedulable = True
        self.containers: dict[Key, Container] = {}
        self.pod_dirs: dict[Key, Path] = {}
        self._tasks: dict[Key, asyncio.Task[None]] = {}
        self._stopping: set[asyncio.Task[None]] = set()
        net = random.randint(100, 250)  # one /16 per fake cluster: parallel runs do not meet
        self._ips = (f"127.{net}.{i // 250}.{i % 250 + 1}" for i in itertools.count())

    # -- called by the API server ---------------------------------------------------------

    def start(self, key: Key) -> None:
        self._tasks[key] = asyncio.ensure_future(self._run(key))

    def stop(self, key: Key, grace_s: int) -> None:
        task = asyncio.ensure_future(self._stop(key, grace_s))
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    def set_schedulable(self, schedulable: bool) -> None:
        """As cordoning a node, or adding one: pending pods get scheduled when it comes."""
        self.schedulable = schedulable
        for key, pod in self.registry.pods.items():
            if schedulable and not pod["spec"].get("nodeName"):
                self.start(key)

    async def shutdown(self) -> None:
        for key in list(self._tasks):
            await self._stop(key, 0)
        await asyncio.gather(*self._stopping, return_exceptions=True)
        self.cgroups.destroy_all()

    # -- a pod's life ---------------------------------------------------------------------

    def _status(self, key: Key, **changes: Any) -> None:
        def apply(pod: dict[str, Any]) -> None:
            pod["status"].update(changes)

        self.registry.update(key, apply)

    async def _run(self, key: Key) -> None:
        pod = self.registry.pods[key]
        if not self.schedulable:
            self._status(
                key,
                conditions=[
                    _condition(
                        "PodScheduled",
                        False,
                        "Unschedulable",
                        "0/1 nodes are available: 1 node(s) were unschedulable.",
                    )
                ],
            )
            return
        ip = next(self._ips)
        self.registry.update(key, lambda p: p["spec"].update(nodeName="fake-node"))
        self._status(
            key,
            podIP=ip,
            podIPs=[{"ip": ip}],
            hostIP="127.0.0.1",
            startTime=now_rfc3339(),
            conditions=_conditions(pod, ready=False),
        )
        self.pod_dirs[key] = pod_dir = self.root / pod["metadata"]["uid"]
        try:
            volumes = self._volumes(pod["spec"], pod_dir)
            for init in pod["spec"].get("initContainers", []):
                await asyncio.to_thread(self._run_init, pod["spec"], init, volumes, pod_dir)
            # In the loop, not a thread: a delete meanwhile must find the container.
            container = self._start_container(pod, ip, volumes, pod_dir)
        except ContainerError as exc:
            self._fail_start(key, pod, exc.reason, str(exc))
            return
        except (OSError, cgroups.CgroupUnavailable) as exc:
            self._fail_start(key, pod, "StartError", str(exc))
            return
        self.containers[key] = container
        self._status(key, phase="Running", containerStatuses=[_running(pod, ready=False)])
        await self._supervise(key, pod, container, ip)

    def _fail_start(self, key: Key, pod: dict[str, Any], reason: str, message: str) -> None:
        waiting = {"waiting": {"reason": reason, "message": message}}
        self._status(
            key,
            phase="Failed",
            reason=reason,
            message=message,
            containerStatuses=[_container_status(pod, waiting, ready=False)],
        )

    def _run_init(
        self, spec: dict[str, Any], c: dict[str, Any], volumes: dict[str, str], pod_dir: Path
    ) -> None:
        mounts = _mounts(c, volumes)
        command = [*_identity(spec, c), *_translate(c, mounts)]
        done = subprocess.run(command, env={}, cwd="/", capture_output=True, check=False)
        if done.returncode != 0:
            tail = done.stderr.decode(errors="replace").strip()[-1500:]
            raise ContainerError("Init:Error", f"init container {c['name']} failed: {tail}")

    def _start_container(
        self, pod: dict[str, Any], ip: str, volumes: dict[str, str], pod_dir: Path
    ) -> Container:
        spec = pod["spec"]
        if len(spec["containers"]) != 1:
            raise ContainerError("StartError", "the fake node runs pods of one container")
        c = spec["containers"][0]
        mounts = _mounts(c, volumes)
        env = {}
        for var in c.get("env", []):
            if "value" not in var:
                raise ContainerError("CreateContainerConfigError", f"unsupported env {var}")
            env[var["name"]] = mounts.get(var["value"], var["value"])
        argv = [re.sub(r"^0\.0\.0\.0:", f"{ip}:", a) for a in _translate(c, mounts)]
        limits = c.get("resources", {}).get("limits", {})
        cgroup = self.cgroups.create(
            f"pod-{pod['metadata']['uid']}",
            cgroups.Limits(
                memory_mb=int(quantity(limits.get("memory", "1Gi")) // 1024**2),
                pids_max=PIDS_MAX,
                cpus=quantity(limits.get("cpu", "1")),
            ),
        )
        script = ["set -eu", *(f"echo $$ > {shlex.quote(f)}" for f in cgroup.procs_files)]
        script.append("unset PWD")  # the shell's own; the container gets the spec's env only
        command = [*_identity(spec, c), *argv]
        script.append("exec " + shlex.join(command))
        with (pod_dir / "container.log").open("ab") as log:
            proc = subprocess.Popen(
                ["/bin/sh", "-c", "\n".join(script)],
                env=env,
                cwd="/",
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        return Container(proc, cgroup, time.monotonic())

    def _volumes(self, spec: dict[str, Any], pod_dir: Path) -> dict[str, str]:
        """emptyDir volumes as host directories; returns volume name -> directory."""
        pod_dir.mkdir(mode=0o755)
        dirs = {}
        for volume in spec.get("volumes", []):
            if "emptyDir" not in volume:
                raise ContainerError("CreateContainerConfigError", f"unsupported {volume}")
            path = pod_dir / volume["name"]
            path.mkdir()
            path.chmod(0o777)  # as a kubelet makes them
            dirs[volume["name"]] = str(path)
        return dirs

    async def _supervise(self, key: Key, pod: dict[str, Any], c: Container, ip: str) -> None:
        probe = pod["spec"]["containers"][0].get("readinessProbe")
        deadline_s = pod["spec"].get("activeDeadlineSeconds")
        period = probe.get("periodSeconds", 10) if probe else 0
        next_probe = c.started + (probe.get("initialDelaySeconds", 0) if probe else 0)
        ready, failures = False, 0
        while True:
            if c.proc.poll() is not None:
                await asyncio.to_thread(c.kill)
                code = c.proc.returncode
                self._status(
                    key,
                    phase="Succeeded" if code == 0 else "Failed",
                    conditions=_conditions(pod, ready=False),
                    containerStatuses=[_terminated(pod, code, "Error")],
                )
                return
            if deadline_s is not None and time.monotonic() - c.started > deadline_s:
                await asyncio.to_thread(c.kill)
                self._status(
                    key,
                    phase="Failed",
                    reason="DeadlineExceeded",
                    message="Pod was active on the node longer than the specified deadline",
                    conditions=_conditions(pod, ready=False),
                    containerStatuses=[_terminated(pod, 137, "DeadlineExceeded")],
                )
                return
            if time.monotonic() >= next_probe:
                next_probe += period
                ok = await _probe(pod, probe, ip) if probe else True
                failures = 0 if ok else failures + 1
                if ok != ready and (ok or failures >= probe.get("failureThreshold", 3)):
                    ready = ok
                    self._status(
                        key,
                        conditions=_conditions(pod, ready=ready),
                        containerStatuses=[_running(pod, ready=ready)],
                    )
            await asyncio.sleep(TICK_S)

    async def _stop(self, key: Key, grace_s: int) -> None:
        if (task := self._tasks.pop(key, None)) is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if (container := self.containers.pop(key, None)) is not None:
            if container.proc.poll() is None:
                container.proc.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    await asyncio.to_thread(container.proc.wait, grace_s)
            await asyncio.to_thread(container.kill)
        if (pod_dir := self.pod_dirs.pop(key, None)) is not None:
            shutil.rmtree(pod_dir, ignore_errors=True)
        self.registry.remove(key)


def _mounts(c: dict[str, Any], volumes: dict[str, str]) -> dict[str, str]:
    """The container's mount paths -> their host directories."""
    return {m["mountPath"]: volumes[m["name"]] for m in c.get("volumeMounts", [])}


def _translate(c: dict[str, Any], mounts: dict[str, str]) -> list[str]:
    """The container's command as this host runs it (see the module's docstring)."""
    argv = [*c.get("command", []), *c.get("args", [])]
    # The spec's own paths first: this interpreter's path may lie under a mount path (/tmp).
    for mount, directory in mounts.items():
        argv = [
            directory + a[len(mount) :] if a == mount or a.startswith(f"{mount}/") else a
            for a in argv
        ]
    if argv[:2] == ["sandcell", "daemon"]:
        return [sys.executable, "-m", "sandcell.daemon", *argv[2:]]
    if argv[:2] == ["python", "-m"]:
        return [sys.executable, *argv[1:]]
    if not any(argv[:1] and argv[0].startswith(f"{d}/") for d in mounts.values()):
        raise ContainerError("StartError", f"the fake image cannot run {argv}")
    return argv


def _identity(spec: dict[str, Any], c: dict[str, Any]) -> list[str]:
    """setpriv for the pod's user, no_new_privs and dropped capabilities; as a non-root
    test user, only what an unprivileged process may do to itself (no_new_privs)."""
    sc = {**spec.get("securityContext", {}), **c.get("securityContext", {})}
    uid, gid = sc.get("runAsUser"), sc.get("runAsGroup", sc.get("runAsUser"))
    if sc.get("runAsNonRoot") and not uid:  # the fake image has no USER: it would be root
        raise ContainerError(
            "CreateContainerConfigError", "container has runAsNonRoot and image will run as root"
        )
    setpriv = []
    if os.geteuid() == 0 and uid is not None:
        setpriv += [f"--reuid={uid}", f"--regid={gid}", "--clear-groups"]
    if os.geteuid() == 0 and "ALL" in sc.get("capabilities", {}).get("drop", []):
        setpriv += ["--inh-caps=-all", "--bounding-set=-all"]
    if sc.get("allowPrivilegeEscalation") is False:
        setpriv.append("--no-new-privs")
    return [SETPRIV, *setpriv, "--"] if setpriv else []


async def _probe(pod: dict[str, Any], probe: dict[str, Any], ip: str) -> bool:
    get = probe["httpGet"]
    port = get["port"]
    if isinstance(port, str):  # a named container port
        ports = pod["spec"]["containers"][0].get("ports", [])
        port = next((p["containerPort"] for p in ports if p.get("name") == port), 0)
    try:
        async with httpx.AsyncClient(timeout=probe.get("timeoutSeconds", 1)) as client:
            response = await client.get(f"http://{ip}:{port}{get.get('path', '/')}")
    except httpx.HTTPError:
        return False
    return 200 <= response.status_code < 400


def _condition(kind: str, ok: bool, reason: str = "", message: str = "") -> dict[str, Any]:
    cond = {"type": kind, "status": "True" if ok else "False", "lastTransitionTime": now_rfc3339()}
    return {**cond, "reason": reason, "message": message} if reason else cond


def _conditions(pod: dict[str, Any], ready: bool) -> list[dict[str, Any]]:
    reason = "" if ready else "ContainersNotReady"
    names = " ".join(c["name"] for c in pod["spec"]["containers"])
    message = "" if ready else f"containers with unready status: [{names}]"
    return [
        _condition("PodScheduled", True),
        _condition("Initialized", True),
        _condition("ContainersReady", ready, reason, message),
        _condition("Ready", ready, reason, message),
    ]


def _container_status(pod: dict[str, Any], state: dict[str, Any], ready: bool) -> dict:
    c = pod["spec"]["containers"][0]
    return {
        "name": c["name"],
        "image": c["image"],
        "imageID": "",
        "ready": ready,
        "restartCount": 0,
        "started": "running" in state,
        "state": state,
    }


def _running(pod: dict[str, Any], ready: bool) -> dict[str, Any]:
    return _container_status(pod, {"running": {"startedAt": now_rfc3339()}}, ready)


def _terminated(pod: dict[str, Any], code: int, reason: str) -> dict[str, Any]:
    state = {"terminated": {"exitCode": code, "reason": reason, "finishedAt": now_rfc3339()}}
    return _container_status(pod, state, False)
