"""Exec `true` straight on a daemon's unix socket, in a real cell, against bare subprocess.

.venv/bin/python -m bench.exec_direct [--n 500]
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from pathlib import Path

from bench.stats import print_table, sample_ms, summary
from sandcell import tokens
from sandcell.daemon.client import DaemonClient
from sandcell.isolation.cell import LocalCells, new_cell_id
from sandcell.isolation.policy import CellPolicy


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=500)
    n = parser.parse_args().n
    with tempfile.TemporaryDirectory(prefix="sandcell-bench-") as tmp:
        cells = LocalCells(Path(tmp) / "cells", cgroup_parent="sandcell-bench")
        bootstrap, session = tokens.generate_p256(), tokens.generate_p256()
        cell_id = new_cell_id()
        info = cells.create(cell_id, CellPolicy(), "sbx-bench", tokens.public_pem(bootstrap))
        try:
            client = DaemonClient({"uds": info.uds}, "sbx-bench", session)
            client.init(
                tokens.mint_bootstrap_token(bootstrap, "sbx-bench", tokens.public_pem(session))
            )
            rows = [
                summary(
                    "bare subprocess.run(['true']) (baseline)",
                    sample_ms(lambda: subprocess.run(["true"], check=True), n),
                ),
                summary(
                    "exec true, daemon in a cell, unix socket",
                    sample_ms(lambda: client.exec(["true"]), n),
                ),
                summary(
                    "GET /health, same socket (HTTP floor)",
                    sample_ms(lambda: client.http.get("/health"), n),
                ),
            ]
        finally:
            cells.destroy(cell_id)
            if cells.cgroups is not None:
                cells.cgroups.destroy_all()
    print_table(rows)
    overhead = rows[1]["median_ms"] - rows[0]["median_ms"]  # type: ignore[operator]
    print(f"daemon overhead at the median: {overhead:.3f} ms")


if __name__ == "__main__":
    main()
