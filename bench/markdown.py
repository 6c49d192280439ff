"""The results as a markdown table."""

from __future__ import annotations

from typing import Any

EXTRA = (
    "per_second",
    "mb_per_s",
    "baseline_mb_per_s",
    "cores",
    "pss_mb",
    "anon_mb",
    "file_mb",
    "shmem_mb",
    "exec_ok",
    "cells_left_after_delete",
    "router_cpu_ms_per_exec",
    "proxy_cpu_ms_per_mb",
    "bench_cpu_ms_per_mb",
    "ratio",
    "p99_ratio",
    "daemon_calls_per_run",
)


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| figure | n | median ms | p99 ms | baseline (median ms) | other | target |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        baseline = f"{r['baseline']} ({r['baseline_median_ms']})" if "baseline" in r else ""
        other = ", ".join(f"{k}={r[k]}" for k in EXTRA if k in r)
        lines.append(
            f"| {r['figure']} | {r['n']} | {r['median_ms']} | {r['p99_ms']} | "
            f"{baseline} | {other} | {r.get('target', '')} |"
        )
    return "\n".join(lines) + "\n"
