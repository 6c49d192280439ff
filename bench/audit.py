"""`python -m bench audit`: exec through the router with the audit trail on (the default),
beside the same figure of a server with `[audit] enabled = false`, in the same run (SPEC §20:
at most 5 % more). Telemetry is off on both. The trail's records are read back at the end, so
a figure that lost records would show."""

from __future__ import annotations

from pathlib import Path

from bench.figures import WARMUP, Row, Server
from bench.paired import interleaved_execs


def figures(tmp: Path, n: int) -> list[Row]:
    (tmp / "off").mkdir()
    (tmp / "on").mkdir()
    off = Server(tmp / "off", 1, "\n[audit]\nenabled = false\n")
    on = None
    try:
        on = Server(tmp / "on", 1)
        rows = interleaved_execs(
            off,
            on,
            n,
            (
                "exec true through the router, audit trail off",
                "exec true through the router, audit trail on (SQLite)",
            ),
            "<= 5% over off (SPEC §20)",
        )
        recorded = on.http.get("/v1/audit", params={"action": "exec", "limit": 1000})
        rows[1]["exec_records"] = len(recorded.raise_for_status().json()["records"])
        rows[1]["exec_records_expected"] = min(n + WARMUP, 1000)
    finally:
        for server in (off, on):
            if server is not None:
                server.close()
    return rows
