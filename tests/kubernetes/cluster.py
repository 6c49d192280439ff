"""The fake cluster: API server + node, served by uvicorn on 127.0.0.1 in a thread.

Tests in other threads (or the sandcell server in another process) reach it over HTTP only;
`FakeCluster` methods that read or change its state run on its own event loop.
"""

from __future__ import annotations

import asyncio
import copy
import secrets
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import uvicorn

from sandcell.isolation import cgroups

from .apiserver import PodRegistry, create_app
from .kubelet import Kubelet

T = TypeVar("T")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FakeCluster:
    def __init__(self) -> None:
        # Not under pytest's 0700 tmp dirs: the pods' user (runAsUser) must reach its volumes.
        self.root = Path(tempfile.mkdtemp(prefix="fakekube-"))
        self.root.chmod(0o755)
        self.cgroup_parent = f"fakekube-{secrets.token_hex(3)}"
        self.registry = PodRegistry()
        self.kubelet = Kubelet(self.registry, self.root, self.cgroup_parent)
        self.registry.node = self.kubelet
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._loop = asyncio.new_event_loop()
        self._server = uvicorn.Server(
            uvicorn.Config(
                create_app(self.registry, self._shutdown),
                host="127.0.0.1",
                port=self.port,
                loop="asyncio",
                http="h11",
                log_level="critical",  # a dropped watch is logged as an ASGI error
                timeout_graceful_shutdown=2,
            )
        )
        self._thread = threading.Thread(target=self._serve, name="fakekube", daemon=True)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._server.serve())
        finally:
            self._loop.close()

    async def _shutdown(self) -> None:
        await self.kubelet.shutdown()

    def start(self) -> FakeCluster:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the fake API server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        """Stops every pod (killing its processes), then the server; nothing is left."""
        if self._thread.is_alive():
            self.call(self.registry.drop_watches, True)
            self._server.should_exit = True
            self._thread.join(30)
        cgroups.detect(self.cgroup_parent).destroy_all()
        shutil.rmtree(self.root, ignore_errors=True)

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Runs `fn(*args)` on the cluster's loop and returns its result."""

        async def run() -> T:
            return fn(*args)

        future: Future[T] = asyncio.run_coroutine_threadsafe(run(), self._loop)
        return future.result(10)

    # -- what tests look at -----------------------------------------------------------------

    def pods(self, namespace: str | None = None) -> list[dict[str, Any]]:
        def snapshot() -> list[dict[str, Any]]:
            return [
                copy.deepcopy(p)
                for (ns, _), p in sorted(self.registry.pods.items())
                if namespace in (None, ns)
            ]

        return self.call(snapshot)

    def pod(self, name: str) -> dict[str, Any] | None:
        return next((p for p in self.pods() if p["metadata"]["name"] == name), None)

    def received(self) -> list[dict[str, Any]]:
        """Every pod body POSTed, as the client sent it."""
        return self.call(lambda: copy.deepcopy(self.registry.received))

    def requests(self) -> list[tuple[str, str]]:
        return self.call(lambda: list(self.registry.requests))

    def running_processes(self) -> set[int]:
        return self.call(
            lambda: {pid for c in self.kubelet.containers.values() for pid in c.cgroup.pids()}
        )

    def kill_container(self, name: str) -> None:
        """As if the daemon crashed: every process of the pod dies; the node notices."""

        def kill() -> None:
            key = next(k for k in self.kubelet.containers if k[1] == name)
            self.kubelet.containers[key].cgroup.kill_all()

        self.call(kill)

    def wait_for(self, what: Callable[[], Any], timeout_s: float = 15, message: str = "") -> Any:
        deadline = time.monotonic() + timeout_s
        while not (result := what()):
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting: {message or what}")
            time.sleep(0.05)
        return result
