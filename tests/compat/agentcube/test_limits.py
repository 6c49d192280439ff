"""A session id is no way around its owner's limits: keyless calls hold the owner's slots."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sdk.helpers import stop_and_clean
from support.server import SMALL_TEMPLATE, RunningServer, start_server

pytestmark = pytest.mark.slow
INVOKE = "/agentcube/v1/namespaces/default/code-interpreters/default/invocations/api/execute"
ONE_AT_A_TIME = "\n[server]\nmax_inflight_per_key = 1\n"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    base: Path = tmp_path_factory.mktemp("agentcube-limits")
    srv = start_server(
        base / "data", config_text=SMALL_TEMPLATE.format(warm_pool=0) + ONE_AT_A_TIME
    )
    try:
        yield srv
    finally:
        stop_and_clean(srv)


def test_keyless_calls_count_against_the_owners_key(server: RunningServer, api_key: str):
    with server.client(api_key) as http:
        created = http.post("/agentcube/v1/code-interpreter", json={"name": "default"})
    headers = {"x-agentcube-session-id": created.raise_for_status().json()["sessionId"]}
    slow = threading.Thread(
        target=lambda: server.client().post(
            INVOKE, json={"command": ["sleep", "3"]}, headers=headers
        )
    )
    slow.start()
    try:
        time.sleep(1)  # the sleep holds the key's only slot
        with server.client() as http:
            by_session = http.post(INVOKE, json={"command": ["true"]}, headers=headers)
        with server.client(api_key) as http:
            by_key = http.get("/v1/sandboxes")
        assert by_session.status_code == 429 and by_key.status_code == 429
    finally:
        slow.join()
    with server.client() as http:
        assert http.post(INVOKE, json={"command": ["true"]}, headers=headers).status_code == 200
