"""Persistent state of sandcell: sandboxes, session keys, API keys, manager secrets (SPEC §7),
principals' secrets (§17), the node roster (§18)."""

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
    NODE_STATES,
    STATES,
    ApiKeyRecord,
    NodeRecord,
    NodeState,
    SandboxRecord,
    SnapshotRecord,
    State,
    UserSecretRecord,
)

__all__ = [
    "NODE_STATES",
    "STATES",
    "ApiKeyExistsError",
    "ApiKeyRecord",
    "ByteReservation",
    "NodeRecord",
    "NodeState",
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
