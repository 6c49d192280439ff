"""`sandcell audit verify`: exit 0 on the configured store's clean trail, 1 with one finding a
line once a record is edited behind the store's back."""

from __future__ import annotations

import asyncio
from pathlib import Path

from typer.testing import CliRunner

from sandcell.audit.chain import AuditLog
from sandcell.audit.records import command_detail
from sandcell.cli import app
from sandcell.serve import opened_store
from sandcell.settings import load_settings

from .tamper import SQLiteTamper


def _record(data_dir: Path, n: int) -> None:
    async def put() -> None:
        async with opened_store(load_settings(None, data_dir)) as store:
            log = AuditLog(store, "router-a")
            for i in range(n):
                await log.append(
                    "exec", principal="alice", key_name="ci", touched=command_detail(str(i))
                )

    asyncio.run(put())


def test_audit_verify_reports_clean_then_names_the_edit(tmp_path: Path) -> None:
    runner = CliRunner()
    done = runner.invoke(app, ["audit", "verify", "--data-dir", str(tmp_path)])
    assert (done.exit_code, done.output) == (0, "audit trail intact: 0 records of 0 writers\n")
    _record(tmp_path, 4)
    done = runner.invoke(app, ["audit", "verify", "--data-dir", str(tmp_path)])
    assert (done.exit_code, done.output) == (0, "audit trail intact: 4 records of 1 writers\n")

    store_url = load_settings(None, tmp_path).store_url
    tamper = SQLiteTamper(Path(store_url.removeprefix("sqlite://")))
    tamper.edit("router-a", 2, principal="mallory")
    tamper.delete("router-a", 4)
    tamper.close()
    done = runner.invoke(app, ["audit", "verify", "--data-dir", str(tmp_path)])
    assert done.exit_code == 1
    assert done.output.splitlines() == [
        "audit router-a seq 2: changed: its hash does not match its contents",
        "audit router-a seq 4: removed: seq 4 missing (the chain's end: the head records seq 4)",
    ]
