"""`sandcell doctor`: what this host can enforce, then a real trial cell."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from sandcell import tokens
from sandcell.isolation.cell import CellError, LocalCells, new_cell_id
from sandcell.isolation.policy import CellPolicy, IsolationUnavailable
from sandcell.isolation.probe import probe_host


def trial_cell() -> tuple[bool, str]:
    """Starts and destroys one cell of the default policy: the proof that it can run."""
    with tempfile.TemporaryDirectory(prefix="sandcell-doctor-") as tmp:
        cells = LocalCells(Path(tmp) / "cells", cgroup_parent="sandcell-doctor")
        cell_id = new_cell_id()
        started = time.monotonic()
        try:
            cells.create(
                cell_id, CellPolicy(), "sbx-doctor", tokens.public_pem(tokens.generate_p256())
            )
        except (IsolationUnavailable, CellError, OSError) as exc:
            return False, str(exc)
        finally:
            elapsed = time.monotonic() - started
            cells.destroy(cell_id)
            if cells.cgroups is not None:
                cells.cgroups.destroy_all()
        return True, f"a default cell started and answered in {elapsed * 1000:.0f} ms"


def run(console: Console) -> int:
    table = Table(title="sandcell doctor: isolation layers on this host")
    table.add_column("layer")
    table.add_column("status")
    table.add_column("detail")
    reports = probe_host()
    for r in reports:
        table.add_row(r.layer, "[green]ok[/]" if r.available else "[red]missing[/]", r.detail)
    console.print(table)
    if not all(r.available for r in reports):
        console.print(
            "[red]The default template cannot run here[/]: every layer is required "
            "unless a template lists it in allow_degraded."
        )
        return 1
    ok, detail = trial_cell()
    console.print(f"{'[green]ok[/]' if ok else '[red]failed[/]'} trial cell: {detail}")
    return 0 if ok else 1
