"""`[audit]` of the configuration file (SPEC §20): how commands are kept, the JSON-lines sink,
retention and the writer's name. Every key is checked here; an unknown one is refused by name.

    [audit]
    enabled = true             # false records nothing (a benchmark's baseline, a throwaway dev box)
    commands = "digest"        # or "full": the command text too (default: length and SHA-256)
    sink = "/var/log/sandcell/audit.jsonl"   # a copy of each record, one JSON object a line
    max_age_days = 90          # retention by age (default: keep everything)
    max_records = 1000000      # retention by count, per writer
    writer = "router-a"        # this process's chain (default: host name and port)
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandcell.audit.records import COMMAND_MODES, CommandMode
from sandcell.audit.trail import Retention

KEYS = frozenset({"enabled", "commands", "sink", "max_age_days", "max_records", "writer"})
MAX_WRITER = 128


class AuditConfigError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class AuditSettings:
    enabled: bool = True
    commands: CommandMode = "digest"
    sink: Path | None = None
    max_age_days: float | None = None
    max_records: int | None = None
    writer: str = ""  # "" until `writer_for` names it after the listening address

    def retention(self) -> Retention | None:
        if self.max_age_days is None and self.max_records is None:
            return None
        age = None if self.max_age_days is None else self.max_age_days * 86400
        return Retention(max_age_s=age, max_records=self.max_records)

    def writer_for(self, port: int) -> str:
        """This process's writer id: the configured one, else `<host name>:<port>`, one per
        server a host runs (two processes under one id are refused by the store)."""
        return self.writer or f"{socket.gethostname()}:{port}"


def parse_audit(table: dict[str, Any], base: Path | None) -> AuditSettings:
    unknown = set(table) - KEYS
    if unknown:
        raise AuditConfigError(f"[audit]: unknown keys {sorted(unknown)}")
    enabled = table.get("enabled", True)
    if not isinstance(enabled, bool):
        raise AuditConfigError("[audit] enabled must be true or false")
    commands = table.get("commands", "digest")
    if commands not in COMMAND_MODES:
        raise AuditConfigError(f"[audit] commands must be one of {sorted(COMMAND_MODES)}")
    sink = table.get("sink")
    if sink is not None and (not isinstance(sink, str) or not sink):
        raise AuditConfigError("[audit] sink must be the path of a file, e.g. /var/log/audit.jsonl")
    age = table.get("max_age_days")
    if age is not None and (isinstance(age, bool) or not isinstance(age, int | float) or age <= 0):
        raise AuditConfigError("[audit] max_age_days must be a positive number of days")
    count = table.get("max_records")
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
        raise AuditConfigError("[audit] max_records must be a positive integer")
    writer = table.get("writer", "")
    if not isinstance(writer, str) or len(writer) > MAX_WRITER or not writer.isprintable():
        raise AuditConfigError(f"[audit] writer must be a name of at most {MAX_WRITER} characters")
    path = None if sink is None else Path(sink)
    if path is not None and not path.is_absolute() and base is not None:
        path = base / path
    if not enabled and len(table) > 1:
        others = sorted(set(table) - {"enabled"})
        raise AuditConfigError(f"[audit] enabled = false: {others} cannot take effect")
    return AuditSettings(enabled, commands, path, age, count, writer)
