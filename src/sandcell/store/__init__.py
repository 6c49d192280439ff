"""Persistent state of sandcell: sandboxes, session keys, API keys, manager secrets (SPEC §7)."""

from .base import ApiKeyExistsError, ByteReservation, Reservation, Store
from .crypto import (
    Sealer,
    StoreCryptoError,
    hash_api_key,
    load_store_key,
    new_api_key,
)
from .factory import open_store
from .records import STATES, ApiKeyRecord, SandboxRecord, SnapshotRecord, State

__all__ = [
    "STATES",
    "ApiKeyExistsError",
    "ApiKeyRecord",
    "ByteReservation",
    "Reservation",
    "SandboxRecord",
    "Sealer",
    "SnapshotRecord",
    "State",
    "Store",
    "StoreCryptoError",
    "hash_api_key",
    "load_store_key",
    "new_api_key",
    "open_store",
]
