"""Figures of SPEC §13 for a workspace holding 100 MB and 1 GB: pause, resume (to the first
exec, by auto-resume), and a snapshot, beside a same-run `cp --sparse=always` of the
workspace image (what copying it costs with nothing of sandcell around it)."""

from __future__ import annotations

import subprocess
import tempfile
import time
from pathlib import Path

from bench.figures import Row, Server, row

MB = 1_000_000
CONFIG = "disk_mb = 1536\n"  # appended to the bench config's [templates.default]


def figures(root: Path, sizes_mb: tuple[int, ...] = (100, 1000), repeats: int = 5) -> list[Row]:
    server = Server(root, warm_pool=0, config_text=CONFIG)
    try:
        return [r for size in sizes_mb for r in _one_size(server, size, repeats)]
    finally:
        server.close()


def _one_size(server: Server, size_mb: int, repeats: int) -> list[Row]:
    sandbox_id = server.create()
    base = f"/v1/sandboxes/{sandbox_id}"
    fill = f"head -c {size_mb * MB} /dev/urandom > blob && sync"
    server.http.post(f"{base}/exec", json={"command": fill}, timeout=600).raise_for_status()
    label = f"({size_mb} MB workspace)"
    image = next((server.srv.data_dir / "cells").glob("*/disk.img"))
    cp = row(f"cp --sparse=always of the image {label}", _cp_ms(image, repeats))
    snaps = row(f"snapshot {label}", _snapshot_ms(server, base, repeats), cp)
    pauses, resumes = [], []
    for _ in range(repeats):
        pauses.append(_timed(lambda: server.http.post(f"{base}/pause", timeout=600)))
        resumes.append(_timed(lambda: server.exec_true(sandbox_id)))  # auto-resume, then exec
    server.delete(sandbox_id)
    for r in (cp, snaps):
        r["mb_per_s"] = round(size_mb / (r["median_ms"] / 1000), 1)
    return [
        cp,
        snaps,
        row(f"pause {label}", pauses),
        row(f"resume to first exec {label}", resumes),
    ]


def _timed(fn: object) -> float:
    start = time.perf_counter()
    response = fn()  # type: ignore[operator]
    if response is not None:
        response.raise_for_status()
    return (time.perf_counter() - start) * 1000


def _cp_ms(image: Path, repeats: int) -> list[float]:
    samples = []
    with tempfile.TemporaryDirectory(dir=image.parent.parent.parent) as tmp:
        copy = Path(tmp) / "copy.img"
        for _ in range(repeats):
            argv = ["cp", "--sparse=always", str(image), str(copy)]
            samples.append(_timed(lambda argv=argv: subprocess.run(argv, check=True) and None))
            copy.unlink()
    return samples


def _snapshot_ms(server: Server, base: str, repeats: int) -> list[float]:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        r = server.http.post(f"{base}/snapshots", timeout=600)
        r.raise_for_status()
        samples.append((time.perf_counter() - start) * 1000)
        server.http.delete(f"/v1/snapshots/{r.json()['id']}").raise_for_status()
    return samples
