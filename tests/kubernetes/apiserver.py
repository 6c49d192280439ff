"""A fake Kubernetes API server: the core/v1 pods REST surface, over real HTTP.

What it keeps of the real one: resourceVersions from one counter, `labelSelector` and
`fieldSelector` (pods' supported fields only), list/get/create/delete with `Status` errors
(400, 404 NotFound, 409 AlreadyExists, 422 Invalid), watches as chunked JSON lines that
start from a resourceVersion (or from synthetic ADDED events without one), 410 Expired
for a version older than the compacted history, and graceful deletion (deletionTimestamp,
then DELETED once the kubelet has stopped the pod; at once for an unscheduled pod).

What tests may do to it: `compact()` (old versions become 410), `drop_watches()` (cut every
watch connection mid-stream, or end them cleanly), `fail_next(method, code)`.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from .selectors import Matcher, SelectorError, field_selector, label_selector

Key = tuple[str, str]  # (namespace, name)
POD_FIELDS = frozenset(
    {
        "metadata.name",
        "metadata.namespace",
        "spec.nodeName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "status.phase",
        "status.podIP",
        "status.nominatedNodeName",
    }
)
REASONS = {
    400: "BadRequest",
    404: "NotFound",
    409: "AlreadyExists",
    410: "Expired",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
}
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
DEFAULT_GRACE_S = 30


def now_rfc3339() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def status_body(code: int, message: str, details: dict[str, Any] | None = None) -> dict:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": REASONS.get(code, "Unknown"),
        "details": details or {},
        "code": code,
    }


class ApiFailure(Exception):
    def __init__(self, code: int, message: str, name: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.details = {"name": name, "kind": "pods"} if name else {}

    def response(self) -> JSONResponse:
        return JSONResponse(status_body(self.code, str(self), self.details), self.code)


@dataclass(frozen=True)
class Event:
    rv: int
    type: str
    pod: dict[str, Any]

    def line(self) -> bytes:
        return json.dumps({"type": self.type, "object": self.pod}).encode() + b"\n"


DROP, END = "drop", "end"  # what a watcher's queue may carry besides events


class Node(Protocol):
    """The kubelet side: runs what is created, stops what is deleted."""

    def start(self, key: Key) -> None: ...

    def stop(self, key: Key, grace_s: int) -> None: ...


@dataclass
class PodRegistry:
    node: Node | None = None
    rv: int = 0
    pods: dict[Key, dict[str, Any]] = field(default_factory=dict)
    history: list[Event] = field(default_factory=list)
    oldest_rv: int = 0  # watching from a version below this gets 410 Expired
    watchers: set[asyncio.Queue[Event | str]] = field(default_factory=set)
    received: list[dict[str, Any]] = field(default_factory=list)  # create bodies, as sent
    requests: list[tuple[str, str]] = field(default_factory=list)
    failures: dict[str, list[int]] = field(default_factory=dict)

    # -- state changes (the kubelet uses update/remove) -----------------------------------

    def _commit(self, kind: str, pod: dict[str, Any]) -> dict[str, Any]:
        self.rv += 1
        pod["metadata"]["resourceVersion"] = str(self.rv)
        event = Event(self.rv, kind, copy.deepcopy(pod))
        self.history.append(event)
        for queue in self.watchers:
            queue.put_nowait(event)
        return event.pod

    def update(self, key: Key, change: Callable[[dict[str, Any]], None]) -> None:
        if (pod := self.pods.get(key)) is not None:
            change(pod)
            self._commit("MODIFIED", pod)

    def remove(self, key: Key) -> None:
        if (pod := self.pods.pop(key, None)) is not None:
            self._commit("DELETED", pod)

    # -- faults ---------------------------------------------------------------------------

    def compact(self) -> None:
        self.history.clear()
        self.oldest_rv = self.rv + 1

    def drop_watches(self, clean: bool = False) -> None:
        for queue in self.watchers:
            queue.put_nowait(END if clean else DROP)

    def fail_next(self, method: str, code: int, times: int = 1) -> None:
        self.failures.setdefault(method, []).extend([code] * times)

    def raise_injected_failure(self, method: str) -> None:
        if pending := self.failures.get(method):
            raise ApiFailure(pending.pop(0), "injected failure")

    # -- the REST verbs -------------------------------------------------------------------

    def create(self, namespace: str, body: Any) -> dict[str, Any]:
        self.received.append(copy.deepcopy(body))
        if not isinstance(body, dict) or body.get("kind", "Pod") != "Pod":
            raise ApiFailure(400, "the body must be a Pod")
        meta = body.setdefault("metadata", {})
        name = meta.get("name")
        if not isinstance(name, str) or not _DNS_SUBDOMAIN.match(name):
            raise ApiFailure(422, f'Pod "{name}" is invalid: metadata.name: Invalid value', name)
        if meta.setdefault("namespace", namespace) != namespace:
            raise ApiFailure(400, "the namespace of the object does not match the request")
        containers = (body.get("spec") or {}).get("containers") or []
        if not containers or not all(c.get("name") and c.get("image") for c in containers):
            raise ApiFailure(422, f'Pod "{name}" is invalid: spec.containers: Required value')
        if (namespace, name) in self.pods:
            raise ApiFailure(409, f'pods "{name}" already exists', name)
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=now_rfc3339())
        body.update(apiVersion="v1", kind="Pod", status={"phase": "Pending"})
        self.pods[(namespace, name)] = body
        created = self._commit("ADDED", body)
        if self.node is not None:
            self.node.start((namespace, name))
        return created

    def get(self, namespace: str, name: str) -> dict[str, Any]:
        if (pod := self.pods.get((namespace, name))) is None:
            raise ApiFailure(404, f'pods "{name}" not found', name)
        return copy.deepcopy(pod)

    def matching(self, namespace: str, match: Matcher) -> list[dict[str, Any]]:
        return [
            copy.deepcopy(p)
            for (ns, _), p in sorted(self.pods.items())
            if ns == namespace and match(p)
        ]

    def delete(self, namespace: str, name: str, grace_s: int | None) -> dict[str, Any]:
        key = (namespace, name)
        pod = self.get(namespace, name)
        if pod["metadata"].get("deletionTimestamp"):
            return pod
        grace = (
            grace_s
            if grace_s is not None
            else pod["spec"].get("terminationGracePeriodSeconds", DEFAULT_GRACE_S)
        )
        if grace == 0 or not pod["spec"].get("nodeName"):  # no kubelet to wait for
            self.remove(key)
            if self.node is not None:
                self.node.stop(key, 0)
            return pod

        def mark(p: dict[str, Any]) -> None:
            p["metadata"]["deletionTimestamp"] = now_rfc3339()
            p["metadata"]["deletionGracePeriodSeconds"] = grace

        self.update(key, mark)
        if self.node is not None:
            self.node.stop(key, grace)
        return copy.deepcopy(self.pods[key])

    def watch(
        self, namespace: str, match: Matcher, version: str | None, timeout_s: float | None
    ) -> AsyncIterator[bytes]:
        """Subscribes at once (a change made before the stream is read is not missed)."""
        if version not in (None, "", "0") and int(version) < self.oldest_rv:
            message = f"too old resource version: {version} ({self.oldest_rv})"
            line = json.dumps({"type": "ERROR", "object": status_body(410, message)}).encode()
            return _lines([line])
        if version in (None, "", "0"):  # "from now", after the current state as ADDED
            backlog = [Event(self.rv, "ADDED", p) for p in self.matching(namespace, match)]
        else:
            backlog = [e for e in self.history if e.rv > int(version)]
        queue: asyncio.Queue[Event | str] = asyncio.Queue()
        self.watchers.add(queue)
        return self._stream(queue, backlog, namespace, match, timeout_s)

    async def _stream(
        self,
        queue: asyncio.Queue[Event | str],
        backlog: list[Event],
        namespace: str,
        match: Matcher,
        timeout_s: float | None,
    ) -> AsyncIterator[bytes]:
        try:
            for event in backlog:
                if event.pod["metadata"]["namespace"] == namespace and match(event.pod):
                    yield event.line()
            async with asyncio.timeout(timeout_s):
                while (item := await queue.get()) != END:
                    if item == DROP:
                        raise ConnectionAbortedError("watch dropped (injected)")
                    assert isinstance(item, Event)
                    if item.pod["metadata"]["namespace"] == namespace and match(item.pod):
                        yield item.line()
        except TimeoutError:
            return  # the server's timeoutSeconds: a clean end of the stream
        finally:
            self.watchers.discard(queue)


async def _lines(lines: list[bytes]) -> AsyncIterator[bytes]:
    for line in lines:
        yield line


def _query_int(request: Request, name: str) -> int | None:
    value = request.query_params.get(name)
    if value is None:
        return None
    if not value.lstrip("-").isdigit():
        raise ApiFailure(400, f"{name} must be an integer")
    return int(value)


def create_app(registry: PodRegistry, on_shutdown: Callable[[], Awaitable[None]]) -> Starlette:
    async def handle(request: Request) -> Response:
        registry.requests.append((request.method, str(request.url.include_query_params())))
        namespace = request.path_params["namespace"]
        try:
            registry.raise_injected_failure(request.method)
            name = request.path_params.get("name")
            if request.method == "POST":
                try:
                    body = json.loads(await request.body())
                except ValueError:
                    raise ApiFailure(400, "the body is not JSON") from None
                return JSONResponse(registry.create(namespace, body), 201)
            if request.method == "DELETE" and name:
                grace = _query_int(request, "gracePeriodSeconds")
                return JSONResponse(registry.delete(namespace, name, grace))
            if name:
                return JSONResponse(registry.get(namespace, name))
            params = request.query_params
            try:
                match_labels = label_selector(params.get("labelSelector"))
                match_fields = field_selector(params.get("fieldSelector"), POD_FIELDS)
            except SelectorError as exc:
                raise ApiFailure(400, str(exc)) from None

            def match(pod: dict[str, Any]) -> bool:
                return match_labels(pod) and match_fields(pod)

            if params.get("watch") in ("true", "1"):
                version = params.get("resourceVersion")
                if version not in (None, "") and not version.isdigit():
                    raise ApiFailure(400, f"invalid resource version {version!r}")
                timeout = _query_int(request, "timeoutSeconds")
                stream = registry.watch(namespace, match, version, timeout)
                return StreamingResponse(stream, media_type="application/json")
            return JSONResponse(
                {
                    "kind": "PodList",
                    "apiVersion": "v1",
                    "metadata": {"resourceVersion": str(registry.rv)},
                    "items": registry.matching(namespace, match),
                }
            )
        except ApiFailure as exc:
            return exc.response()

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        yield
        await on_shutdown()

    base = "/api/v1/namespaces/{namespace}/pods"
    return Starlette(
        routes=[
            Route(base, handle, methods=["GET", "POST"]),
            Route(base + "/{name}", handle, methods=["GET", "DELETE"]),
        ],
        lifespan=lifespan,
    )
