"""The records the store keeps, and their two serialised forms.

`to_dict` gives the JSON-safe form used by APIs and tests. `to_flat` gives the one-level form both
backends persist (an SQLite row, a Redis hash): scalars stay scalars, booleans become 0/1 and dicts
become JSON text, so one field such as `last_activity_at` can be rewritten in place without reading
the record first. `from_dict` reads either form, so the two backends share one serialisation
instead of each growing its own.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import (
    TYPE_CHECKING,
    Any,
    ClassVar,
    Literal,
    Protocol,
    Self,
    get_args,
    get_origin,
    get_type_hints,
)

State = Literal[
    "creating",
    "running",
    "deleting",
    "deleted",
    "failed",
    "pausing",
    "paused",
    "resuming",
    "snapshotting",
]
STATES: frozenset[str] = frozenset(get_args(State))
# A sandbox in one of these counts against no live limit: a paused one holds no cell (SPEC
# §13); a deleted one is gone for its owner, its cell's processes are dead and only the
# cell's teardown is pending (the manager's background teardown, retried by the reaper).
PARKED_STATES: tuple[str, ...] = ("paused", "deleted")
# A sandbox in one of these keeps a workspace with no cell on it, or is moving one between a
# cell and its home: what the per-key bound on paused sandboxes counts (SPEC §13). So does a
# paused one being snapshotted ("snapshotting" with `paused_at`).
PAUSED_STATES: tuple[str, ...] = ("pausing", "paused", "resuming")

Flat = dict[str, str | int | float]


class Fields(Protocol):
    """What `from_dict` reads a record from: a dict, a Redis hash, an `sqlite3.Row`."""

    def __getitem__(self, name: str, /) -> Any: ...


def deadline_of(expires_at: float, last_activity_at: float, idle_timeout_s: int) -> float:
    """When a sandbox must be reaped: at its max lifetime, or after `idle_timeout_s` of silence."""
    return min(expires_at, last_activity_at + idle_timeout_s)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _json_dict(value: Any) -> dict[str, Any]:
    if value is None:  # a field added after the record was written (Redis hashes)
        return {}
    return json.loads(value) if isinstance(value, str | bytes) else dict(value)


def _json_tuple(value: Any) -> tuple[Any, ...]:
    if value is None:
        return ()
    return tuple(json.loads(value) if isinstance(value, str | bytes) else value)


def _field_decoders(cls: type) -> dict[str, Callable[[Any], Any]]:
    """Per-field converters that accept both native values and the bytes Redis hands back."""
    decoders: dict[str, Callable[[Any], Any]] = {}
    for name, hint in get_type_hints(cls).items():
        if get_origin(hint) is dict:
            decoders[name] = _json_dict
        elif get_origin(hint) is tuple:
            decoders[name] = _json_tuple
        elif hint is bool:
            decoders[name] = lambda v: bool(int(v)) if isinstance(v, str | bytes) else bool(v)
        elif hint in (int, float):
            decoders[name] = hint
        else:
            decoders[name] = _text
    return decoders


# Typed as a plain callable: `cache` asks for Hashable arguments, and mypy does not see a
# record class as one (it checks the class's unbound `__hash__`), though every class is.
_decoders: Callable[[type], dict[str, Callable[[Any], Any]]] = cache(_field_decoders)


class _Record:
    """Serialisation shared by every record type (dataclass fields only: scalars,
    and dicts and tuples of scalars, kept as JSON text)."""

    __slots__ = ()
    if TYPE_CHECKING:  # every subclass is a dataclass (not at run time: type hints are fields)
        __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    @classmethod
    def fields(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Fields) -> Self:
        """Build from `to_dict` or `to_flat` output, or a raw row/hash (extra keys are ignored).
        A field absent from a hash written by an older version (None) takes its default."""
        values = {name: data[name] for name in _decoders(cls)}
        return cls(**{n: _decoders(cls)[n](v) for n, v in values.items() if v is not None})

    def to_flat(self) -> Flat:
        flat: Flat = {}
        for name, value in self.to_dict().items():
            if isinstance(value, dict):
                flat[name] = json.dumps(value, separators=(",", ":"), sort_keys=True)
            elif isinstance(value, tuple):
                flat[name] = json.dumps(list(value), separators=(",", ":"))
            elif isinstance(value, bool):
                flat[name] = int(value)
            else:
                flat[name] = value
        return flat


@dataclass(frozen=True, slots=True)
class SandboxRecord(_Record):
    id: str
    owner: str
    template: str
    state: State
    created_at: float
    expires_at: float
    idle_timeout_s: int
    last_activity_at: float
    metadata: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    backend: str = ""
    endpoint: dict[str, str | int] = field(default_factory=dict)
    cell: dict[str, str | int] = field(default_factory=dict)
    network: dict[str, Any] = field(default_factory=dict)  # the egress policy (SPEC §11)
    # Persistence (SPEC §13). While paused, `expires_at` is when the paused TTL ends and
    # `last_activity_at` equals it (so the idle term never comes first); `paused_at` is when
    # the pause happened, 0 while running. `lifetime_s` restarts the lifetime on resume.
    auto_resume: bool = True
    on_timeout: str = "delete"
    lifetime_s: int = 0
    paused_at: float = 0.0
    workspace: str = ""  # the backend's place for the workspace while no cell holds it
    resources: dict[str, Any] = field(default_factory=dict)  # cpus, memory_mb, disk_mb
    # The principal's secrets this sandbox was given (SPEC §17): name -> its placeholder here.
    # Placeholders are not secret; the values stay in the owner's sealed secret records.
    secrets: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.state not in STATES:
            raise ValueError(f"invalid sandbox state {self.state!r}; expected one of {STATES}")

    @property
    def deadline(self) -> float:
        return deadline_of(self.expires_at, self.last_activity_at, self.idle_timeout_s)

    @property
    def keeps_workspace(self) -> bool:
        """Whether it counts against its owner's paused bound (see PAUSED_STATES)."""
        return self.state in PAUSED_STATES or (self.state == "snapshotting" and self.paused_at > 0)


@dataclass(frozen=True, slots=True)
class SnapshotRecord(_Record):
    """A copy of a sandbox's workspace (SPEC §13), owned by the principal that took it.
    Written only once the copy is whole at `path`, so a listed snapshot is never half."""

    id: str
    owner: str
    sandbox_id: str
    name: str
    template: str
    created_at: float
    size_bytes: int
    path: str


@dataclass(frozen=True, slots=True)
class ApiKeyRecord(_Record):
    """An API key as stored: only its hash, never the key itself."""

    name: str
    principal: str
    key_hash: str
    admin: bool
    created_at: float
    revoked: bool = False


@dataclass(frozen=True, slots=True)
class UserSecretRecord(_Record):
    """A principal's secret (SPEC §17), all but its value: that is sealed apart, bound to the
    owner and the name, and read only by `Store.user_secret_value`."""

    owner: str
    name: str
    hosts: tuple[str, ...]  # canonical host names, optionally with `:port`
    places: tuple[str, ...]  # where the proxy may substitute it: "headers", "query", "body"
    created_at: float
    updated_at: float


NodeState = Literal["active", "draining"]
NODE_STATES: frozenset[str] = frozenset(get_args(NodeState))


@dataclass(frozen=True, slots=True)
class NodeRecord(_Record):
    """A node of the roster (SPEC §18) as it last reported itself. Capacity is what the node
    offers in all; the free figures and `live_cells` count what sandboxes hold (warm pooled
    cells are free capacity: claiming one takes a cell like a cold create). `state` is the
    operator's (a heartbeat never changes it); whether the node is reachable is computed from
    `heartbeat_at` (`sandcell.store.nodes.liveness`), never stored."""

    name: str
    address: str  # host:port of its node API
    version: str
    heartbeat_at: float
    memory_mb: int
    cpus: float
    cells: int
    disk_mb: int
    free_memory_mb: int
    free_cpus: float
    free_disk_mb: int
    live_cells: int
    labels: dict[str, str] = field(default_factory=dict)
    state: NodeState = "active"
    registered_at: float = 0.0

    @property
    def free_cells(self) -> int:
        return max(0, self.cells - self.live_cells)
