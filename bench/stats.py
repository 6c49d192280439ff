"""Timing loops and the summary every benchmark prints."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def sample_ms(fn: Callable[[], object], n: int, warmup: int = 20) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        out.append((time.perf_counter() - start) * 1000)
    return out


def summary(name: str, samples: list[float]) -> dict[str, float | str | int]:
    ordered = sorted(samples)
    return {
        "figure": name,
        "n": len(ordered),
        "median_ms": round(statistics.median(ordered), 3),
        "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 3),
    }


def print_table(rows: list[dict[str, float | str | int]]) -> None:
    print(f"{'figure':<48} {'n':>5} {'median ms':>10} {'p99 ms':>10}")
    for r in rows:
        print(f"{r['figure']:<48} {r['n']:>5} {r['median_ms']:>10} {r['p99_ms']:>10}")
