"""A daemon client for a sandbox that a manager made, signed with its stored session key."""

from __future__ import annotations

from sandcell import tokens
from sandcell.cellapi.client import DaemonClient
from sandcell.manager.manager import Manager


async def session_client(manager: Manager, sandbox_id: str) -> DaemonClient:
    record = await manager.store.get_sandbox(sandbox_id)
    pem = await manager.store.get_session_key(sandbox_id)
    assert record is not None and pem is not None
    return DaemonClient(record.endpoint, sandbox_id, tokens.load_private_key(pem))
