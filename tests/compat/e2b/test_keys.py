"""`sandcell keys create NAME --e2b`: a key in E2B's own shape, taken as it is by the façade
and by /v1, so e2b releases that check the key's format (2.2x-2.3x) need no encoding."""

from __future__ import annotations

import re

import httpx
from e2b import Sandbox

from support.server import RunningServer

# The check e2b 2.31.0 makes before any call (`e2b.api.validate_api_key`).
E2B_KEY_FORMAT = re.compile(r"\Ae2b_[0-9a-f]+\Z")


def test_e2b_key_has_e2b_shape_and_is_taken_as_is(e2b_server: RunningServer) -> None:
    key = e2b_server.create_key("native-e2b", e2b=True)
    assert E2B_KEY_FORMAT.match(key) and len(key) == len("e2b_") + 40
    sandbox = Sandbox.create(api_key=key, timeout=60)
    try:
        assert sandbox.commands.run("echo native").stdout == "native\n"
        listed = httpx.get(f"{e2b_server.url}/e2b/v2/sandboxes", headers={"X-API-KEY": key})
        assert listed.status_code == 200
        assert sandbox.sandbox_id in {s["sandboxID"] for s in listed.json()}
        # The same key is a sandcell key: /v1 sees the sandbox as its owner's.
        mine = httpx.get(
            f"{e2b_server.url}/v1/sandboxes/{sandbox.sandbox_id}",
            headers={"Authorization": f"Bearer {key}"},
        )
        assert mine.status_code == 200, mine.text
    finally:
        sandbox.kill()


def test_altered_e2b_key_is_refused(e2b_server: RunningServer) -> None:
    key = e2b_server.create_key("native-e2b-altered", e2b=True)
    altered = key[:-1] + ("0" if key[-1] != "0" else "1")
    answer = httpx.get(f"{e2b_server.url}/e2b/v2/sandboxes", headers={"X-API-KEY": altered})
    assert answer.status_code == 401
    assert set(answer.json()) == {"code", "message"}


def test_hex_encoded_sandcell_key_still_works(e2b_server: RunningServer) -> None:
    key = e2b_server.create_key("hex-encoded")
    encoded = "e2b_" + key.encode().hex()
    answer = httpx.get(f"{e2b_server.url}/e2b/v2/sandboxes", headers={"X-API-KEY": encoded})
    assert answer.status_code == 200, answer.text
