"""Each figure of the benchmark table, measured beside its baseline in the same run."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from bench.environment import RunningServer, direct_client, oci, start_server
from bench.stats import sample_ms, summary
from sandcell import tokens
from sandcell.isolation.bwrap import SYSTEM_LINKS
from sandcell.isolation.cell import LocalCells, new_cell_id
from sandcell.isolation.policy import CellPolicy

Row = dict[str, Any]
TEMPLATE = """
[server]
max_sandboxes_per_key = 1000
[templates.default]
warm_pool = {warm_pool}
"""


def _bwrap(*command: str) -> list[str]:
    links = [a for p in SYSTEM_LINKS if os.path.islink(p) for a in ("--symlink", os.readlink(p), p)]
    return [
        "bwrap",
        "--unshare-all",
        "--ro-bind",
        "/usr",
        "/usr",
        *links,
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--",
        *command,
    ]


def _run(argv: list[str]) -> Callable[[], object]:
    return lambda: subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)


def row(name: str, samples: list[float], baseline: Row | None = None, target: str = "") -> Row:
    out = summary(name, samples)
    if baseline is not None:
        out["baseline"] = baseline["figure"]
        out["baseline_median_ms"] = baseline["median_ms"]
    out["target"] = target
    return out


class Server:
    """A `sandcell serve` with a key, for the figures that go through the router. `template`
    is the one its sandboxes are made of (`image_template_server` adds an image one)."""

    def __init__(
        self, root: Path, warm_pool: int, config_text: str = "", template: str = "default"
    ) -> None:
        self.srv: RunningServer = start_server(
            root / f"data-{warm_pool}-{template}",
            config_text=TEMPLATE.format(warm_pool=warm_pool) + config_text,
        )
        try:
            self.key = self.srv.create_key("bench", admin=True)
        except BaseException:
            self.srv.stop()  # nothing else would: close() is for a Server that exists
            raise
        self.http = self.srv.client(self.key)
        self.template = template

    def create(self) -> str:
        r = self.http.post("/v1/sandboxes", json={"template": self.template})
        r.raise_for_status()
        return r.json()["id"]

    def exec_true(self, sandbox_id: str) -> None:
        r = self.http.post(f"/v1/sandboxes/{sandbox_id}/exec", json={"command": ["true"]})
        r.raise_for_status()

    def delete(self, sandbox_id: str) -> None:
        self.http.delete(f"/v1/sandboxes/{sandbox_id}")

    def wait_pool(self, size: int, timeout_s: float = 30) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            text = self.http.get("/metrics").text
            if f'sandcell_pool_ready{{template="{self.template}"}} {float(size)}' in text:
                return
            time.sleep(0.02)
        raise TimeoutError("warm pool did not refill")

    def close(self) -> None:
        """Stops the server and destroys what a failed run left (live sandboxes outlive a
        server stop by design)."""
        self.http.close()
        self.srv.stop()
        LocalCells(self.srv.data_dir / "cells").destroy_all()


WARMUP = 20


def process_cpu_s(pid: int) -> float:
    """User plus system CPU seconds a process (all its threads) has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def exec_round_trips(server: Server, n: int) -> list[Row]:
    base = row("bare subprocess.run(['true'])", sample_ms(_run(["true"]), n))
    sandbox_id = server.create()
    direct = direct_client(server.srv, sandbox_id)
    on_socket = row(
        "exec true, direct on the daemon's unix socket",
        sample_ms(lambda: direct.exec(["true"]), n),
        base,
        "overhead <= 1.0 ms",
    )
    cpu_before = process_cpu_s(server.srv.proc.pid)
    routed = row(
        "exec true through the router (API key, JWT)",
        sample_ms(lambda: server.exec_true(sandbox_id), n, WARMUP),
        on_socket,
        "router overhead <= 1.0 ms",
    )
    # The server's own CPU per proxied exec: steadier under a loaded machine than latency.
    spent = process_cpu_s(server.srv.proc.pid) - cpu_before
    routed["router_cpu_ms_per_exec"] = round(spent * 1000 / (n + WARMUP), 3)
    direct.close()
    server.delete(sandbox_id)
    return [base, on_socket, routed]


def throughput(server: Server, clients: int = 16, seconds: float = 10.0) -> list[Row]:
    ids = [server.create() for _ in range(4)]

    async def worker(
        client: httpx.AsyncClient, sandbox_id: str, stop: float, latencies: list[float]
    ) -> None:
        while time.monotonic() < stop:
            started = time.perf_counter()
            r = await client.post(f"/v1/sandboxes/{sandbox_id}/exec", json={"command": ["true"]})
            r.raise_for_status()
            latencies.append((time.perf_counter() - started) * 1000)

    async def main() -> list[float]:
        latencies: list[float] = []
        limits = httpx.Limits(max_connections=clients)
        async with httpx.AsyncClient(
            base_url=server.srv.url,
            limits=limits,
            timeout=60,
            headers={"authorization": f"Bearer {server.key}"},
        ) as c:
            stop = time.monotonic() + seconds
            await asyncio.gather(
                *(worker(c, ids[i % len(ids)], stop, latencies) for i in range(clients))
            )
        return latencies

    latencies = asyncio.run(main())
    for sandbox_id in ids:
        server.delete(sandbox_id)
    out = row(
        f"exec true, {clients} concurrent clients, {seconds:.0f} s",
        latencies,
        target=">= 400 exec/s",
    )
    out["per_second"] = round(len(latencies) / seconds, 1)
    return [out]


def image_template_server(root: Path, warm_pool: int) -> Server:
    """A server whose `tiny` template is a busybox OCI image (no Python), built before use."""
    oci.write_archive(root / "busybox.tar", [oci.busybox_rootfs()])
    image = f'[templates.tiny]\nwarm_pool = {warm_pool}\nimage.base = "oci-archive:busybox.tar"\n'
    server = Server(root, warm_pool, image, template="tiny")
    with server.http.stream("POST", "/v1/templates/tiny/build", timeout=300) as r:
        events = [json.loads(line) for line in r.iter_lines() if line]
    if events[-1]["event"] != "done":
        raise RuntimeError(f"the bench image did not build: {events[-1]}")
    return server


def _create_to_first_exec(
    server: Server, n: int, warmup: int = 0, before: Callable[[], object] = lambda: None
) -> list[float]:
    """Create to the first exec's result, `n` times; the delete after each is not timed."""
    samples = []
    for i in range(warmup + n):
        before()
        started = time.perf_counter()
        sandbox_id = server.create()
        server.exec_true(sandbox_id)
        if i >= warmup:
            samples.append((time.perf_counter() - started) * 1000)
        server.delete(sandbox_id)
    return samples


def warm_claims(server: Server, n: int, label: str = "") -> list[Row]:
    base = row("bare bwrap ... true", sample_ms(_run(_bwrap("/usr/bin/true")), n))
    samples = _create_to_first_exec(server, n, before=lambda: server.wait_pool(2))
    return [
        base,
        row(
            f"warm-pool claim to first exec result{label}",
            samples,
            base,
            "<= 15 ms median, <= 40 ms p99",
        ),
    ]


def cold_creates(server: Server, n: int, label: str = "") -> list[Row]:
    base = row(
        "bare bwrap ... python3 -c pass",
        sample_ms(_run(_bwrap("/usr/bin/python3", "-c", "pass")), n, warmup=3),
    )

    samples = _create_to_first_exec(server, n, warmup=1)
    return [
        base,
        row(
            f"cold create (empty pool) to first exec result{label}",
            samples,
            base,
            "<= 200 ms median",
        ),
    ]


IDLE_CELLS = 10
_PSS_FIELDS = {"Pss:": "pss", "Pss_Anon:": "anon", "Pss_File:": "file", "Pss_Shmem:": "shmem"}


def cell_start_and_memory(n: int) -> list[Row]:
    """Cell start to the daemon's first 200 on /health, and idle cells' PSS: one cell alone
    (shared library pages count nearly whole) and the mean of IDLE_CELLS live at once (they
    are divided among the cells: SPEC §16's idle sandbox memory)."""
    base = row("python3 -c pass", sample_ms(_run(["/usr/bin/python3", "-c", "pass"]), n))
    pem = tokens.public_pem(tokens.generate_p256())
    with tempfile.TemporaryDirectory(prefix="sandcell-bench-") as tmp:
        cells = LocalCells(Path(tmp) / "cells", cgroup_parent="sandcell-bench")
        samples = []
        for _ in range(n):
            cell_id = new_cell_id()
            started = time.perf_counter()
            cells.create(cell_id, CellPolicy(), "sbx-bench", pem)
            samples.append((time.perf_counter() - started) * 1000)
            cells.destroy(cell_id)
        alone = _idle_pss_kib(cells, pem, 1)
        many = _idle_pss_kib(cells, pem, IDLE_CELLS)
        if cells.cgroups is not None:
            cells.cgroups.destroy_all()
    return [
        base,
        row("cell start to first /health 200", samples, base, "<= 150 ms median"),
        _memory_row("idle cell memory, one cell alone (PSS, daemon + cell)", alone, 1, ""),
        _memory_row(
            f"idle memory per cell, mean of {IDLE_CELLS} live (PSS)", many, IDLE_CELLS, "<= 20 MB"
        ),
    ]


def _memory_row(name: str, kib: dict[str, float], cells: int, target: str) -> Row:
    mb = {f"{key}_mb": round(value / 1024, 1) for key, value in kib.items()}
    return {"figure": name, "n": cells, "median_ms": "", "p99_ms": "", **mb, "target": target}


def _idle_pss_kib(cells: LocalCells, pem: bytes, count: int) -> dict[str, float]:
    """The mean PSS per cell (and its anon/file/shmem parts) of `count` idle cells."""
    infos = [cells.create(new_cell_id(), CellPolicy(), "sbx-bench", pem) for _ in range(count)]
    try:
        time.sleep(1)
        totals = dict.fromkeys(_PSS_FIELDS.values(), 0.0)
        for info in infos:
            for key, kib in _pss_kib(cells, info.cgroup).items():
                totals[key] += kib / count
        return totals
    finally:
        for info in infos:
            cells.destroy(info.cell_id)


def _pss_kib(cells: LocalCells, cgroup: str | None) -> dict[str, int]:
    assert cells.cgroups is not None and cgroup is not None
    group = cells.cgroups.open(cgroup)
    assert group is not None
    total = dict.fromkeys(_PSS_FIELDS.values(), 0)
    for pid in group.pids():
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            name, _, value = line.partition(" ")
            if name in _PSS_FIELDS:
                total[_PSS_FIELDS[name]] += int(value.split()[0])
    return total


def many_sandboxes(server: Server, count: int, parallel: int = 8) -> list[Row]:
    """`count` sandboxes live at once: create all, exec in each, delete all, nothing left."""

    async def main() -> tuple[list[float], int]:
        gate = asyncio.Semaphore(parallel)
        async with httpx.AsyncClient(
            base_url=server.srv.url, timeout=120, headers={"authorization": f"Bearer {server.key}"}
        ) as c:

            async def one_create() -> tuple[str, float]:
                async with gate:
                    started = time.perf_counter()
                    r = await c.post("/v1/sandboxes", json={})
                    r.raise_for_status()
                    return r.json()["id"], (time.perf_counter() - started) * 1000

            created = await asyncio.gather(*(one_create() for _ in range(count)))
            ids = [i for i, _ in created]
            outs = await asyncio.gather(
                *(c.post(f"/v1/sandboxes/{i}/exec", json={"command": f"echo {i}"}) for i in ids)
            )
            ok = sum(
                o.status_code == 200 and o.json()["stdout"].strip() == i
                for o, i in zip(outs, ids, strict=True)
            )
            await asyncio.gather(*(c.delete(f"/v1/sandboxes/{i}") for i in ids))
            return [t for _, t in created], ok

    create_ms, ok = asyncio.run(main())
    left = _cells_after_teardowns(server.srv.data_dir / "cells", pool=2)
    out = row(
        f"{count} sandboxes live at once (create latency)", create_ms, target="all succeed, no leak"
    )
    out.update({"exec_ok": ok, "cells_left_after_delete": left})
    return [out]


def _cells_after_teardowns(cells: Path, pool: int, timeout_s: float = 60) -> int:
    """Cells left besides the warm pool's, once the background teardowns that follow each
    DELETE's answer have had the time to finish."""
    deadline = time.monotonic() + timeout_s
    while (left := len(list(cells.iterdir())) - pool) > 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    return left
