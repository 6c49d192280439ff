"""`sandcell nodes ls` (SPEC §18): the roster as the configured store holds it."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from pathlib import Path

from typer.testing import CliRunner

from sandcell.cli import app
from sandcell.serve import opened_store
from sandcell.settings import load_settings
from sandcell.store import NodeRecord

NODE = NodeRecord(
    name="node-a",
    address="10.0.0.7:8701",
    version="0.9.0",
    heartbeat_at=0.0,
    memory_mb=16384,
    cpus=8.0,
    cells=64,
    disk_mb=102400,
    free_memory_mb=12288,
    free_cpus=6.5,
    free_disk_mb=90000,
    live_cells=5,
    labels={"zone": "eu-1", "gpu": "none"},
)


def _register(data_dir: Path, *nodes: NodeRecord, drain: str = "") -> None:
    async def put() -> None:
        async with opened_store(load_settings(None, data_dir)) as store:
            for rec in nodes:
                await store.register_node(rec)
            if drain:
                await store.set_node_state(drain, "draining")

    asyncio.run(put())


def test_nodes_ls_shows_state_liveness_room_labels_and_version(tmp_path: Path) -> None:
    now = time.time()
    live = dataclasses.replace(NODE, heartbeat_at=now)
    gone = dataclasses.replace(NODE, name="node-b", heartbeat_at=now - 60, labels={})
    _register(tmp_path, live, gone, drain="node-b")

    done = CliRunner().invoke(app, ["nodes", "ls", "--data-dir", str(tmp_path)])
    assert done.exit_code == 0, done.output
    header, first, second = done.output.strip().splitlines()
    assert header.split()[:4] == ["NAME", "ADDRESS", "STATE", "LIVENESS"]
    assert first.split()[:9] == [
        "node-a",
        "10.0.0.7:8701",
        "active",
        "live",
        "59/64",
        "12288/16384",
        "6.5/8",
        "90000/102400",
        "gpu=none,zone=eu-1",
    ]
    assert second.split()[:4] == ["node-b", "10.0.0.7:8701", "draining", "unreachable"]
    assert "0.9.0" in first

    done = CliRunner().invoke(app, ["nodes", "ls", "--json", "--data-dir", str(tmp_path)])
    listed = json.loads(done.output)
    assert [(n["name"], n["state"], n["liveness"]) for n in listed] == [
        ("node-a", "active", "live"),
        ("node-b", "draining", "unreachable"),
    ]
    assert listed[0]["labels"] == {"zone": "eu-1", "gpu": "none"}


def test_nodes_ls_on_an_empty_roster(tmp_path: Path) -> None:
    done = CliRunner().invoke(app, ["nodes", "ls", "--json", "--data-dir", str(tmp_path)])
    assert (done.exit_code, json.loads(done.output)) == (0, [])
