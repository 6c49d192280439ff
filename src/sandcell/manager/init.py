"""Stage two of a cell's start: hand its daemon the sandbox's session key (SPEC §6); later,
a new default env for its commands, signed with that key."""

from __future__ import annotations

import asyncio
import json
import random
import time
from typing import Any

import httpx

from sandcell import tokens
from sandcell.cellapi.client import async_transport

FIRST_BACKOFF_S = 0.01
MAX_BACKOFF_S = 1.0


class InitFailed(Exception):
    """The daemon refused the session key or never accepted it in time."""


async def initialize(
    endpoint: dict[str, Any],
    bootstrap_key: tokens.PrivateKey,
    sandbox_id: str,
    session_key: tokens.PrivateKey,
    env: dict[str, str],
    timeout_s: float,
) -> None:
    """POSTs /init until a confirmed 200, with exponential backoff and full jitter.

    A fresh token per attempt; 400/401/403/409 are final: a 409 on a retry means the daemon
    holds some other key, which is a failure, never a success.
    """
    deadline = time.monotonic() + timeout_s
    backoff = FIRST_BACKOFF_S
    transport, base = async_transport(endpoint)
    last: httpx.HTTPError | RuntimeError
    async with httpx.AsyncClient(transport=transport, base_url=base, timeout=5) as client:
        while True:
            token = tokens.mint_bootstrap_token(
                bootstrap_key,
                sandbox_id,
                tokens.public_pem(session_key),
                extra={"env": env} if env else None,
            )
            wait = backoff
            try:
                response = await client.post("/init", json={"token": token})
                if response.status_code == 200:
                    return
                if response.status_code in (400, 401, 403, 409):
                    raise InitFailed(
                        f"daemon refused init: {response.status_code} {response.text[:200]}"
                    )
                if response.status_code == 429:
                    wait = max(wait, float(response.headers.get("retry-after", "1")))
            except httpx.HTTPError as exc:
                last = exc
            else:
                last = RuntimeError(f"status {response.status_code}")
            if time.monotonic() + wait > deadline:
                raise InitFailed(f"init did not succeed within {timeout_s} s: {last}")
            await asyncio.sleep(random.uniform(0, wait))  # noqa: S311 - jitter, not crypto
            backoff = min(backoff * 2, MAX_BACKOFF_S)


async def put_default_env(
    endpoint: dict[str, Any],
    sandbox_id: str,
    session_key: tokens.PrivateKey,
    env: dict[str, str],
    timeout_s: float = 10.0,
) -> None:
    """Replaces a running daemon's default env (`PUT /env`, a token bound to the body);
    raises `httpx.HTTPError` when the daemon cannot be reached or refuses."""
    body = json.dumps({"env": env}).encode()
    token = tokens.mint_request_token(session_key, sandbox_id, "PUT", "/env", body)
    headers = {"authorization": f"Bearer {token}", "content-type": "application/json"}
    transport, base = async_transport(endpoint)
    async with httpx.AsyncClient(transport=transport, base_url=base, timeout=timeout_s) as client:
        response = await client.put("/env", content=body, headers=headers)
    response.raise_for_status()
