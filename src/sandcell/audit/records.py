"""The audit record (SPEC §20): who did what, on which sandbox, when, with what outcome, and
what it touched; each record chained to the one before it by hash.

What a record may say it touched is a closed set of fields, each built by one function below
(`command_detail`, `file_detail`, `egress_detail`, `secret_detail`, `signal_detail`). None of
them takes file contents or a secret's value, and a record refuses any other field, so neither
can reach the trail by mistake.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

Action = Literal[
    "sandbox.create",
    "sandbox.delete",
    "sandbox.pause",
    "sandbox.resume",
    "sandbox.snapshot",
    "sandbox.fork",
    "sandbox.timeout",
    "exec",
    "code.run",
    "process.start",
    "process.attach",
    "process.signal",
    "process.input",
    "file.write",
    "file.read",
    "file.remove",
    "file.list",
    "file.mkdir",
    "file.move",
    "network.change",
    "egress.decision",
    "secret.use",
    "secret.create",
    "secret.update",
    "secret.delete",
    "snapshot.delete",
    "key.create",
    "key.revoke",
    "key.delete",
]
ACTIONS: frozenset[str] = frozenset(get_args(Action))
Outcome = Literal["ok", "refused", "error"]
OUTCOMES: frozenset[str] = frozenset(get_args(Outcome))
CommandMode = Literal["digest", "full"]  # `[audit] commands`: digest unless "full"
COMMAND_MODES: frozenset[str] = frozenset(get_args(CommandMode))
Touched = dict[str, str | int]
MAX_PAGE = 1000

# The `prev` of a chain's first record.
GENESIS = "0" * 64
# Every field a record may carry in `touched`; nothing else is accepted.
TOUCHED_FIELDS: frozenset[str] = frozenset(
    {
        "command_length",
        "command_sha256",
        "command",
        "path",
        "to",
        "size",
        "host",
        "port",
        "decision",
        "secret",
        "signal",
        "template",
        "egress",
        "timeout_s",
        "child",
        "snapshot",
        "key",
        "admin",
    }
)


def command_detail(command: str, mode: CommandMode = "digest") -> Touched:
    """A command as the trail keeps it: its length (in UTF-8 bytes) and SHA-256, and the text
    itself only when the operator set `[audit] commands = "full"`."""
    if mode not in COMMAND_MODES:
        raise ValueError(f"audit commands must be one of {sorted(COMMAND_MODES)}, not {mode!r}")
    data = command.encode("utf-8", "surrogatepass")  # the bytes as sent, a lone surrogate too
    detail: Touched = {
        "command_length": len(data),
        "command_sha256": hashlib.sha256(data).hexdigest(),
    }
    if mode == "full":
        detail["command"] = command  # a record's texts are made valid UTF-8 (`_text`)
    return detail


def _text(value: str) -> str:
    """`value` as valid UTF-8 text: JSON from a caller may hold lone surrogates, which no
    UTF-8 encoder takes (a record with one could never be stored: the writer would stall)."""
    return value if value.isascii() else value.encode("utf-8", "replace").decode("utf-8")


def file_detail(*, path: str, size: int | None = None) -> Touched:
    """A file operation: the path and, for a write or read, the size in bytes (never the
    contents: there is no parameter for them)."""
    return {"path": path} if size is None else {"path": path, "size": size}


def egress_detail(*, host: str, port: int, decision: str) -> Touched:
    return {"host": host, "port": port, "decision": decision}


def secret_detail(*, name: str, host: str, decision: str = "") -> Touched:
    """A secret's use: its name and the host it went to (never its value)."""
    detail: Touched = {"secret": name, "host": host}
    if decision:
        detail["decision"] = decision
    return detail


def signal_detail(*, signal: str | int) -> Touched:
    return {"signal": str(signal)}


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """One entry of one writer's chain. `seq` counts from 1 per writer; `prev` is the `hash`
    of the writer's record before it (GENESIS for the first); `hash` is the SHA-256 of this
    record's canonical bytes (`canonical`). A record made by `sealed` has the right `hash`;
    one read back from a store is whatever the store holds, which `verify` checks."""

    writer: str  # a router's or node's name: one chain each, so writers never contend
    seq: int
    at: float  # epoch seconds
    principal: str
    key_name: str
    action: Action
    sandbox_id: str = ""
    outcome: Outcome = "ok"
    status: int = 200
    touched: dict[str, str | int] = field(default_factory=dict)
    prev: str = GENESIS
    hash: str = ""

    def __post_init__(self) -> None:
        # One type per field, whatever it came from (an int clock, a REAL column), so the
        # canonical bytes are the same before and after a store.
        for name, kind in (("seq", int), ("at", float), ("status", int)):
            object.__setattr__(self, name, kind(getattr(self, name)))
        for name in ("principal", "key_name", "sandbox_id"):
            object.__setattr__(self, name, _text(getattr(self, name)))
        touched = {k: _text(v) if isinstance(v, str) else v for k, v in self.touched.items()}
        object.__setattr__(self, "touched", touched)
        if self.action not in ACTIONS:
            raise ValueError(f"unknown audit action {self.action!r}")
        if self.outcome not in OUTCOMES:
            raise ValueError(f"audit outcome must be one of {sorted(OUTCOMES)}")
        extra = set(self.touched) - TOUCHED_FIELDS
        if extra:
            raise ValueError(f"audit records keep no field {sorted(extra)}")

    def canonical(self) -> bytes:
        """The bytes `hash` covers: every field but `hash`, as JSON with sorted keys, no
        spaces, UTF-8."""
        body = self.to_dict()
        del body["hash"]
        return canonical_json(body)

    def digest(self) -> str:
        return hashlib.sha256(self.canonical()).hexdigest()

    def sealed(self) -> AuditRecord:
        return AuditRecord(**{**self.to_dict(), "hash": self.digest()})

    def to_dict(self) -> dict[str, Any]:
        # Shallow, field by field: `dataclasses.asdict` deep-copies, at ten times the cost, and
        # `touched` holds only str and int.
        out = {name: getattr(self, name) for name in FIELDS}
        out["touched"] = dict(self.touched)
        return out

    def to_json(self) -> str:
        return canonical_json(self.to_dict()).decode()

    def to_flat(self) -> dict[str, str | int | float]:
        """One level, for an SQLite row: `touched` as canonical JSON text."""
        flat: dict[str, str | int | float] = {**self.to_dict()}
        flat["touched"] = canonical_json(self.touched).decode()
        return flat

    @classmethod
    def from_json(cls, text: str | bytes) -> AuditRecord:
        return cls(**json.loads(text))

    @classmethod
    def from_flat(cls, row: Any) -> AuditRecord:
        """From `to_flat` output or an `sqlite3.Row` of its columns."""
        values = {name: row[name] for name in FIELDS}
        values["touched"] = json.loads(values["touched"])
        return cls(**values)


FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(AuditRecord))


# One encoder for every record: `json.dumps` with options builds a new one on each call.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def canonical_json(value: Any) -> bytes:
    return _CANONICAL.encode(value).encode()


@dataclass(frozen=True, slots=True)
class AuditHead:
    """Where a writer's chain stands: its last record (`seq`, `hash`), and its anchor, the
    first record kept (`anchor_seq`) and the `prev` that record must carry (`anchor_prev`):
    GENESIS and 1 until retention prunes the chain's start."""

    writer: str
    seq: int
    hash: str
    anchor_seq: int = 1
    anchor_prev: str = GENESIS


class AuditConflictError(Exception):
    """An append whose `seq` or `prev` does not follow the stored head: another process
    writes under the same writer id (or this one lost track). Nothing was written."""


@dataclass(frozen=True, slots=True)
class AuditQuery:
    """A page of records across writers, oldest first (by time, then writer and seq). `after`
    is the `next` cursor of the page before."""

    sandbox_id: str | None = None
    action: str | None = None
    principal: str | None = None
    since: float | None = None  # at >= since
    until: float | None = None  # at < until
    after: str | None = None
    limit: int = 100

    def __post_init__(self) -> None:
        if not 1 <= self.limit <= MAX_PAGE:
            raise ValueError(f"audit page limit must be 1 to {MAX_PAGE}")
        if self.after is not None:
            parse_cursor(self.after)

    def matches(self, rec: AuditRecord) -> bool:
        return (
            self.sandbox_id in (None, rec.sandbox_id)
            and self.action in (None, rec.action)
            and self.principal in (None, rec.principal)
            and (self.since is None or rec.at >= self.since)
            and (self.until is None or rec.at < self.until)
            and (self.after is None or order_key(rec) > parse_cursor(self.after))
        )


@dataclass(frozen=True, slots=True)
class AuditPage:
    records: list[AuditRecord]
    next: str | None  # pass as `AuditQuery.after` for the next page; None on the last


def page_of(matching: list[AuditRecord], limit: int) -> AuditPage:
    """A page from the first `limit + 1` matches in order: an extra one says there is more."""
    page = matching[:limit]
    more = len(matching) > limit and bool(page)
    return AuditPage(page, cursor_of(page[-1]) if more else None)


def order_key(rec: AuditRecord) -> tuple[float, str, int]:
    return (rec.at, rec.writer, rec.seq)


def cursor_of(rec: AuditRecord) -> str:
    return canonical_json([rec.at, rec.writer, rec.seq]).decode()


def parse_cursor(cursor: str) -> tuple[float, str, int]:
    try:
        at, writer, seq = json.loads(cursor)
        return (float(at), str(writer), int(seq))
    except (ValueError, TypeError) as exc:
        raise ValueError("invalid audit cursor") from exc
