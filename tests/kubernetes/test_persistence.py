"""Pause, resume and snapshots on the Kubernetes backend: not yet (501), and nothing breaks.

Pods keep no workspace past their end; PersistentVolumeClaims and VolumeSnapshots would
(docs/kubernetes.md). A sandbox asked to pause keeps running; one created with
on_timeout "pause" is deleted at its timeout instead, as the docs say.
"""

from __future__ import annotations

import time

import pytest

from sandcell.errors import ServiceError
from sandcell.manager.manager import Manager, load_bootstrap_key
from sandcell.manager.templates import Template

from .conftest import SMALL

pytestmark = pytest.mark.anyio


async def test_pause_resume_and_snapshot_are_501_and_leave_it_running(cluster, make_backend, store):
    backend = make_backend()
    templates = {"default": Template(name="default", **SMALL)}
    manager = Manager(store, backend, templates, await load_bootstrap_key(store))
    record = await manager.create_sandbox("alice", on_timeout="pause")
    for call in (
        lambda: manager.persistence.pause(record.id),
        lambda: manager.snapshots.take("alice", record.id),
    ):
        with pytest.raises(ServiceError) as info:
            await call()
        assert info.value.status == 501 and "Kubernetes" in info.value.message
        assert (await store.get_sandbox(record.id)).state == "running"
    assert (await manager.persistence.resume(record.id)).state == "running"  # nothing to do
    assert await manager.reap_once(now=time.time() + 10_000) == [record.id]
    assert await store.get_sandbox(record.id) is None
