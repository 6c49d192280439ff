"""Two router processes over one real Redis store serve the same sandboxes."""

from __future__ import annotations

import base64
import os
import time

import pytest
import redis

from support.server import SMALL_TEMPLATE, start_server


@pytest.mark.slow
def test_two_routers_share_one_redis_store(tmp_path, redis_url):
    with redis.Redis.from_url(redis_url) as r:
        r.flushdb()
    config = f'[server]\nstore = "{redis_url}"\n' + SMALL_TEMPLATE.format(warm_pool=0)
    env = {"SANDCELL_STORE_KEY": base64.b64encode(os.urandom(32)).decode()}
    a = start_server(tmp_path / "a", config_text=config, extra_env=env)
    b = start_server(tmp_path / "b", config_text=config, extra_env=env)
    try:
        key = a.create_key("alice")  # written to Redis: B knows it too
        with a.client(key) as ca, b.client(key) as cb:
            sbx = ca.post("/v1/sandboxes", json={}).json()
            base = f"/v1/sandboxes/{sbx['id']}"
            r = cb.post(f"{base}/exec", json={"command": "echo via-b"})
            assert r.status_code == 200 and r.json()["stdout"] == "via-b\n"
            assert [s["id"] for s in cb.get("/v1/sandboxes").json()["sandboxes"]] == [sbx["id"]]
            assert cb.delete(base).status_code == 204
            assert ca.get(base).status_code == 404
        # B tears A's cell down (after its answer: the teardown runs in the background).
        deadline = time.monotonic() + 30
        while list((a.data_dir / "cells").iterdir()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert list((a.data_dir / "cells").iterdir()) == []
        # A restart of B must not touch A's sandboxes: each replica reconciles its own cells.
        with a.client(key) as ca:
            other = ca.post("/v1/sandboxes", json={}).json()
        b.stop()
        b = start_server(tmp_path / "b", config_text=config, extra_env=env)
        with a.client(key) as ca:
            r = ca.post(f"/v1/sandboxes/{other['id']}/exec", json={"command": "true"})
            assert r.status_code == 200
            ca.delete(f"/v1/sandboxes/{other['id']}")
    finally:
        a.stop()
        b.stop()
