"""Persistent state of sandcell: sandboxes, session keys, API keys, manager secrets (SPEC §7),
principals' secrets (§17)."""

from .base import ApiKeyExistsError, ByteReservation, Reservation, SecretPut, Store
from .crypto import (
    Sealer,
    StoreCryptoError,
    hash_api_key,
    load_store_key,
    new_api_key,
)
from .factory import open_store
from .records import (
    STATES,
    ApiKeyRecord,
    SandboxRecord,
    SnapshotRecord,
    State,
    UserSecretRecord,
)

__all__ = [
    "STATES",
    "ApiKeyExistsError",
    "ApiKeyRecord",
    "ByteReservation",
    "Reservation",
    "SandboxRecord",
    "Sealer",
    "SecretPut",
    "SnapshotRecord",
    "State",
    "Store",
    "StoreCryptoError",
    "UserSecretRecord",
    "hash_api_key",
    "load_store_key",
    "new_api_key",
    "open_store",
]
