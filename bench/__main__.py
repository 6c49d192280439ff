"""`python -m bench all [--json out.json] [--quick]`: every figure beside its baseline.

Writes the JSON and a markdown table (bench/results/latest.{json,md}) and prints the table.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from bench import code, datapaths, e2bsdk, egress, figures, persistence, processes
from bench.markdown import table

RESULTS = Path(__file__).resolve().parent / "results"


def run(quick: bool, live: int) -> list[figures.Row]:
    n, claims, colds, starts, many = (100, 10, 5, 10, 20) if quick else (500, 30, 20, 30, 200)
    file_mb, stream_mb = (64, 64) if quick else (512, 256)
    rows: list[figures.Row] = []
    with tempfile.TemporaryDirectory(prefix="sandcell-bench-") as tmp:
        warm = figures.Server(Path(tmp), warm_pool=2)
        try:
            warm.wait_pool(2)
            rows += figures.exec_round_trips(warm, n)
            rows += figures.throughput(warm, seconds=5 if quick else 10)
            rows += figures.warm_claims(warm, claims)
            rows += processes.background_first_byte(warm, claims * 5)
            rows += processes.keystroke_round_trips(warm, n)
            rows += figures.many_sandboxes(warm, many)
            rows += code.code_interpreter(warm, n, starts)
            rows += e2bsdk.commands_run(warm, n)
            rows += datapaths.cli_run(warm, starts)
            rows += datapaths.file_transfers(warm, file_mb, repeats=3)
            rows += datapaths.streamed_stdout(warm, stream_mb, repeats=3)
            for count in (min(50, live), live):
                rows += datapaths.live_sandboxes(warm, count)
        finally:
            warm.close()
        cold = figures.Server(Path(tmp), warm_pool=0)
        try:
            rows += figures.cold_creates(cold, colds)
        finally:
            cold.close()
        rows += _image_template(Path(tmp), claims, colds)
        rows += persistence.figures(Path(tmp), repeats=3 if quick else 5)
    rows += figures.cell_start_and_memory(starts)
    rows += egress.figures(size_mib=64 if quick else 256, repeats=3 if quick else 10, n=n)
    return rows


def _image_template(tmp: Path, claims: int, colds: int) -> list[figures.Row]:
    """The same two figures for a template of a built image (a busybox OCI archive)."""
    label = " (image template)"
    rows: list[figures.Row] = []
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
    parser.add_argument("what", choices=["all"])
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--quick", action="store_true", help="fewer samples (a smoke run)")
    parser.add_argument("--live", type=int, help="sandboxes live at once (default 200; 20 quick)")
    args = parser.parse_args()
    rows = run(args.quick, args.live or (20 if args.quick else 200))
    RESULTS.mkdir(exist_ok=True)
    text = json.dumps(rows, indent=2)
    (RESULTS / "latest.json").write_text(text)
    if args.json:
        args.json.write_text(text)
    md = table(rows)
    (RESULTS / "latest.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
