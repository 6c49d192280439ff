"""`python -m bench all|FIGURE [--json out.json] [--quick]`: every figure beside its baseline.

`all` runs every group below in order; naming one group (`exec`, `start`, `stream`, ...)
runs only it, which is how a change to one path is measured. Writes the JSON and a markdown
table (bench/results/latest.{json,md}) and prints the table.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench import (
    audit,
    code,
    datapaths,
    e2bsdk,
    egress,
    figures,
    persistence,
    processes,
    traces,
)
from bench.markdown import table

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Sizes:
    """Sample counts and sizes: the full run's, or a quick smoke run's."""

    n: int
    claims: int
    colds: int
    starts: int
    many: int
    file_mb: int
    stream_mb: int
    live: int
    seconds: float
    repeats: int

    @classmethod
    def of(cls, quick: bool, live: int | None) -> Sizes:
        if quick:
            return cls(100, 10, 5, 10, 20, 64, 64, live or 20, 5, 3)
        return cls(500, 30, 20, 30, 200, 512, 256, live or 200, 10, 5)


Rows = list[figures.Row]
# Figures measured on a server with a warm pool of two, in this order.
WARM: dict[str, Callable[[figures.Server, Sizes], Rows]] = {
    "exec": lambda s, z: figures.exec_round_trips(s, z.n),
    "throughput": lambda s, z: figures.throughput(s, seconds=z.seconds),
    "claim": lambda s, z: figures.warm_claims(s, z.claims),
    "processes": lambda s, z: (
        processes.background_first_byte(s, z.claims * 5) + processes.keystroke_round_trips(s, z.n)
    ),
    "many": lambda s, z: figures.many_sandboxes(s, z.many),
    "code": lambda s, z: code.code_interpreter(s, z.n, z.starts),
    "e2b": lambda s, z: e2bsdk.commands_run(s, z.n),
    "cli": lambda s, z: datapaths.cli_run(s, z.starts),
    "files": lambda s, z: datapaths.file_transfers(s, z.file_mb, repeats=5),
    "stream": lambda s, z: datapaths.streamed_stdout(s, z.stream_mb, repeats=5),
    "live": lambda s, z: [
        r for count in (min(50, z.live), z.live) for r in datapaths.live_sandboxes(s, count)
    ],
}
# Figures that bring their own servers or none.
ALONE: dict[str, Callable[[Path, Sizes], Rows]] = {
    "cold": lambda tmp, z: _cold(tmp, z.colds),
    "image": lambda tmp, z: _image_template(tmp, z.claims, z.colds),
    "persistence": lambda tmp, z: persistence.figures(tmp, repeats=z.repeats),
    "start": lambda tmp, z: figures.cell_start_and_memory(z.starts),
    "egress": lambda tmp, z: egress.figures(size_mib=z.stream_mb, repeats=z.repeats * 2, n=z.n),
    "traces": lambda tmp, z: traces.figures(tmp, z.n),  # exec with telemetry on, beside off
    "audit": lambda tmp, z: audit.figures(tmp, z.n),  # exec with the audit trail on, beside off
}


def run(groups: list[str], sizes: Sizes) -> Rows:
    rows: Rows = []
    with tempfile.TemporaryDirectory(prefix="sandcell-bench-") as tmp:
        warm_groups = [g for g in groups if g in WARM]
        if warm_groups:
            warm = figures.Server(Path(tmp), warm_pool=2)
            try:
                warm.wait_pool(2)
                for group in warm_groups:
                    rows += WARM[group](warm, sizes)
            finally:
                warm.close()
        for group in (g for g in groups if g in ALONE):
            own = Path(tmp) / group  # servers of different groups never share a data dir
            own.mkdir()
            rows += ALONE[group](own, sizes)
    return rows


def _cold(tmp: Path, colds: int) -> Rows:
    cold = figures.Server(tmp, warm_pool=0)
    try:
        return figures.cold_creates(cold, colds)
    finally:
        cold.close()


def _image_template(tmp: Path, claims: int, colds: int) -> Rows:
    """The same two figures for a template of a built image (a busybox OCI archive)."""
    label = " (image template)"
    rows: Rows = []
    warm = figures.image_template_server(tmp, warm_pool=2)
    try:
        warm.wait_pool(2)
        rows += figures.warm_claims(warm, claims, label)[1:]
    finally:
        warm.close()
    cold = figures.image_template_server(tmp, warm_pool=0)
    try:
        rows += figures.cold_creates(cold, colds, label)[1:]
    finally:
        cold.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("what", nargs="+", choices=["all", *WARM, *ALONE])
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--quick", action="store_true", help="fewer samples (a smoke run)")
    parser.add_argument("--live", type=int, help="sandboxes live at once (default 200; 20 quick)")
    args = parser.parse_args()
    groups = [*WARM, *ALONE] if "all" in args.what else args.what
    rows = run(groups, Sizes.of(args.quick, args.live))
    text = json.dumps(rows, indent=2)
    if args.json:
        args.json.write_text(text)
    md = table(rows)
    if "all" in args.what:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "latest.json").write_text(text)
        (RESULTS / "latest.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
