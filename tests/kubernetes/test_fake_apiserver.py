"""The fake API server answers as the real one does, for what the backend relies on.

Its node is cordoned here (pods stay Pending), so these tests run no daemon.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from .cluster import FakeCluster
from .conftest import NAMESPACE

PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"


def pod(name: str, **labels: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "c", "image": "i"}]},
    }


@pytest.fixture
def api(cluster: FakeCluster) -> Iterator[httpx.Client]:
    cluster.call(cluster.kubelet.set_schedulable, False)
    with httpx.Client(base_url=cluster.url, timeout=5) as client:
        yield client


def events(response: httpx.Response, count: int) -> list[dict]:
    found = []
    for line in response.iter_lines():
        found.append(json.loads(line))
        if len(found) == count:
            break
    return found


def test_errors_are_status_objects(api):
    assert api.post(PODS, json=pod("a")).status_code == 201
    r = api.post(PODS, json=pod("a"))
    assert r.status_code == 409 and r.headers["content-type"] == "application/json"
    assert r.json()["reason"] == "AlreadyExists" and r.json()["kind"] == "Status"
    for r in (api.get(f"{PODS}/nope"), api.delete(f"{PODS}/nope")):
        assert r.status_code == 404 and r.json()["reason"] == "NotFound"
    assert api.post(PODS, json=pod("Not_A_Name")).json()["reason"] == "Invalid"
    r = api.get(PODS, params={"fieldSelector": "spec.containers=x"})
    assert r.status_code == 400 and "not supported" in r.json()["message"]


def test_selectors_and_resource_versions(api):
    api.post(PODS, json=pod("a", app="x", tier="web"))
    api.post(PODS, json=pod("b", app="x"))
    api.post(PODS, json=pod("c", app="y"))

    def names(**params: str) -> list[str]:
        return [p["metadata"]["name"] for p in api.get(PODS, params=params).json()["items"]]

    assert names(labelSelector="app=x") == ["a", "b"]
    assert names(labelSelector="app in (x, y),!tier") == ["b", "c"]
    assert names(labelSelector="app!=x") == ["c"]
    assert names(fieldSelector="metadata.name=b", labelSelector="app") == ["b"]
    listing = api.get(PODS).json()
    versions = [int(p["metadata"]["resourceVersion"]) for p in listing["items"]]
    assert int(listing["metadata"]["resourceVersion"]) >= max(versions)


def test_watch_from_a_version_then_live_events(api):
    created = api.post(PODS, json=pod("a")).json()
    version = created["metadata"]["resourceVersion"]
    params = {"watch": "true", "resourceVersion": version, "fieldSelector": "metadata.name=a"}
    with api.stream("GET", PODS, params=params) as r:
        api.delete(f"{PODS}/a")  # unscheduled: deleted at once
        seen = []
        for line in r.iter_lines():
            seen.append(json.loads(line))
            if seen[-1]["type"] == "DELETED":
                break
    # Only what followed the version: the node's "Unschedulable" status, then the deletion.
    assert [e["type"] for e in seen] == ["MODIFIED", "DELETED"]
    versions = [int(e["object"]["metadata"]["resourceVersion"]) for e in seen]
    assert int(version) < versions[0] < versions[1]


def test_watch_without_version_starts_with_the_current_state(api):
    api.post(PODS, json=pod("a"))
    with api.stream("GET", PODS, params={"watch": "1", "timeoutSeconds": "1"}) as r:
        lines = [json.loads(line) for line in r.iter_lines()]  # ends cleanly after 1 s
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in lines] == [("ADDED", "a")]


def test_too_old_version_is_410_gone(api, cluster):
    version = api.post(PODS, json=pod("a")).json()["metadata"]["resourceVersion"]
    cluster.call(cluster.registry.compact)
    with api.stream("GET", PODS, params={"watch": "true", "resourceVersion": version}) as r:
        (event,) = events(r, 1)
    assert event["type"] == "ERROR" and event["object"]["code"] == 410
    assert event["object"]["reason"] == "Expired"


def test_dropped_watch_is_a_broken_stream(api, cluster):
    with api.stream("GET", PODS, params={"watch": "true"}) as r:
        cluster.call(cluster.registry.drop_watches)
        with pytest.raises(httpx.RemoteProtocolError):
            r.read()
