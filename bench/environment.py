"""What the benchmarks run against: a real `sandcell serve` and direct access to its cells."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from sandcell import tokens
from sandcell.cellapi.client import DaemonClient
from sandcell.settings import load_settings
from sandcell.store import Sealer, load_store_key, open_store

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support import oci
from support.server import RunningServer, start_server

__all__ = ["RunningServer", "direct_client", "oci", "start_server"]


def direct_client(server: RunningServer, sandbox_id: str) -> DaemonClient:
    """A client straight on the sandbox daemon's socket, with its session key from the store."""

    async def lookup() -> tuple[dict, bytes]:
        settings = load_settings(server.config, server.data_dir)
        async with open_store(settings.store_url, Sealer(load_store_key(server.data_dir))) as store:
            record = await store.get_sandbox(sandbox_id)
            pem = await store.get_session_key(sandbox_id)
            assert record is not None and pem is not None
            return record.endpoint, pem

    endpoint, pem = asyncio.run(lookup())
    return DaemonClient(endpoint, sandbox_id, tokens.load_private_key(pem))
