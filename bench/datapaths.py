"""The rows a user feels beyond one exec: the CLI's `run`, big files, streamed output, and
what live but idle sandboxes cost the host."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.environment import direct_client
from bench.figures import Row, Server, row
from bench.stats import sample_ms
from sandcell import tokens
from sandcell.cellapi.client import DaemonClient
from sandcell.client import Sandbox
from sandcell.isolation.runtime import compile_package

MB = 1_000_000
LINE = "0123456789abcdefghijklmnopqrstuvwxyz" * 2
CLK_TCK = os.sysconf("SC_CLK_TCK")


def _sandcell_bin() -> str:
    return str(Path(sys.executable).with_name("sandcell"))


def cli_run(server: Server, n: int) -> list[Row]:
    """`sandcell run -- true` end to end: interpreter, imports, create, exec, delete. Each
    run claims a pooled sandbox, as a user's would: the pool refills between runs. sandcell
    is byte-compiled first, as an install is: a checkout run under PYTHONDONTWRITEBYTECODE
    would compile its modules again on every run (~25 ms)."""
    compile_package()
    env = {**os.environ, "SANDCELL_URL": server.srv.url, "SANDCELL_API_KEY": server.key}
    python = [sys.executable, "-c", "pass"]
    base = row(f"{Path(sys.executable).name} -c pass", sample_ms(_quiet(python), n))
    run = _quiet([_sandcell_bin(), "run", "--", "true"], env)
    samples = []
    for _ in range(n):
        server.wait_pool(2)
        samples.append(_timed(run) * 1000)
    return [base, row("`sandcell run -- true` (CLI, warm pool)", samples, base, "<= 150 ms median")]


def _quiet(argv: list[str], env: dict[str, str] | None = None) -> Callable[[], object]:
    return lambda: subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env=env)


def file_transfers(server: Server, size_mb: int, repeats: int) -> list[Row]:
    """Upload and download of one file through the SDK, beside `cp` of the same file, the
    runs interleaved so that both see the same machine."""
    with tempfile.TemporaryDirectory(prefix="sandcell-bench-") as tmp:
        local = Path(tmp) / "blob"
        with local.open("wb") as out:
            for _ in range(size_mb):
                out.write(os.urandom(MB))
        sbx = _sandbox(server)
        url = f"{server.srv.url}/v1/sandboxes/{sbx.id}/files?path=blob"
        auth = f"authorization: Bearer {server.key}"
        discard = _quiet(["curl", "-sf", "-o", "/dev/null", "-H", auth, url])
        copies, up, down, path_only = [], [], [], []
        try:
            for _ in range(repeats):
                for written in ("copy", "back"):  # each run writes a new file, as cp's does
                    (Path(tmp) / written).unlink(missing_ok=True)
                copies.append(_settled(lambda: shutil.copyfile(local, Path(tmp) / "copy")))
                up.append(_settled(lambda: sbx.files.upload(local, "blob")))
                down.append(_settled(lambda: sbx.files.download("blob", Path(tmp) / "back")))
                path_only.append(_settled(discard))
        finally:
            sbx.kill()
    base = _rate(f"cp of a {size_mb} MB file (host)", size_mb, copies, "")
    target = ">= 1000 MB/s"
    return [
        base,
        _rate(f"upload {size_mb} MB (SDK, through the router)", size_mb, up, target, base),
        _rate(f"download {size_mb} MB (SDK, through the router)", size_mb, down, target, base),
        # What the router and the daemon deliver when no disk write follows on the client.
        _rate(f"download {size_mb} MB, curl to /dev/null", size_mb, path_only, "", base),
    ]


def streamed_stdout(server: Server, size_mb: int, repeats: int) -> list[Row]:
    """A command writing `size_mb` MB to stdout, streamed to an SDK callback, beside the same
    command read from a host pipe and streamed straight from the daemon's socket (no router,
    raw NDJSON); the runs interleaved so that all three see the same machine."""
    # Text, as commands print: NUL bytes would measure JSON's \u0000 escapes instead.
    command = ["sh", "-c", f"yes {LINE} | head -c {size_mb * MB}"]
    sbx = _sandbox(server)
    direct = direct_client(server.srv, sbx.id)
    got: list[int] = []
    host, on_socket, routed = [], [], []
    try:
        for _ in range(repeats):
            host.append(_timed(lambda: _host_pipe(command)))
            on_socket.append(_timed(lambda: _direct_stream(direct, command)))
            routed.append(
                _timed(lambda: sbx.commands.run(command, on_stdout=lambda s: got.append(len(s))))
            )
    finally:
        direct.close()
        sbx.kill()
    if sum(got) != size_mb * MB * repeats:
        raise RuntimeError(f"streamed {sum(got)} bytes, expected {size_mb * MB * repeats}")
    base = _rate(f"{size_mb} MB of stdout read from a host pipe", size_mb, host, "")
    target = ">= 300 MB/s"
    return [
        base,
        _rate(
            f"streamed stdout, {size_mb} MB, direct on the daemon's socket",
            size_mb,
            on_socket,
            "",
            base,
        ),
        _rate(f"streamed stdout, {size_mb} MB (SDK callback)", size_mb, routed, target, base),
    ]


def _sandbox(server: Server) -> Sandbox:
    """A sandbox of the warm pool, once the pool has refilled: a cell starting beside the
    first sample would slow it down."""
    sbx = Sandbox.create(api_key=server.key, url=server.srv.url)
    server.wait_pool(2)
    return sbx


def _host_pipe(command: list[str]) -> None:
    with subprocess.Popen(command, stdout=subprocess.PIPE) as proc:
        assert proc.stdout is not None
        while proc.stdout.read1(1 << 20):
            pass


def _direct_stream(direct: DaemonClient, command: list[str]) -> None:
    """The NDJSON exec stream read raw from the daemon's socket, up to its exit line."""
    body = json.dumps({"command": command}).encode()
    token = tokens.mint_request_token(
        direct.session_key, direct.sandbox_id, "POST", "/v1/exec", body
    )
    headers = {"authorization": f"Bearer {token}", "accept": "application/x-ndjson"}
    tail = b""
    with direct.http.stream("POST", "/v1/exec", content=body, headers=headers) as reply:
        for chunk in reply.iter_raw():
            tail = (tail + chunk[-512:])[-512:]
    if b'"type":"exit"' not in tail:
        raise RuntimeError(f"the stream ended without its exit line: {tail[-200:]!r}")


def live_sandboxes(server: Server, live: int, seconds: float = 10.0) -> list[Row]:
    """`live` sandboxes at once: the CPU the server and every cell use while they sit idle,
    then the latency of an exec in each, round robin."""
    with ThreadPoolExecutor(8) as pool:
        ids = list(pool.map(lambda _: server.create(), range(live)))
    try:
        time.sleep(2)  # let creation and the pool refill settle
        before = _tree_cpu_s(server.srv.proc.pid)
        time.sleep(seconds)
        cores = (_tree_cpu_s(server.srv.proc.pid) - before) / seconds
        turn = iter(ids * 3)
        latency = sample_ms(lambda: server.exec_true(next(turn)), len(ids) * 2, warmup=len(ids))
    finally:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(server.delete, ids))
    idle: Row = {
        "figure": f"idle CPU with {live} live sandboxes (server + cells, {seconds:.0f} s)",
        "n": 1,
        "median_ms": "",
        "p99_ms": "",
        "cores": round(cores, 3),
        "target": "~0",
    }
    return [idle, row(f"exec true through the router, {live} live sandboxes", latency)]


def _tree_cpu_s(root: int) -> float:
    """User + system seconds of `root` and all its descendants (the cells' processes)."""
    parents: dict[int, int] = {}
    times: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()
        parents[int(entry)] = int(fields[1])
        times[int(entry)] = int(fields[11]) + int(fields[12])
    total = 0
    for pid, ticks in times.items():
        walk = pid
        while walk > 1 and walk != root:
            walk = parents.get(walk, 0)
        if walk == root:
            total += ticks
    return total / CLK_TCK


def _settled(fn: Callable[[], object]) -> float:
    """`_timed`, once what the previous step wrote has reached the disk: otherwise its
    writeback (512 MB through the cell's loop device) runs during, and is billed to, the
    next step."""
    os.sync()
    return _timed(fn)


def _timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def _rate(
    name: str, size_mb: int, seconds: list[float], target: str, baseline: Row | None = None
) -> Row:
    rates = sorted(size_mb / s for s in seconds)
    out: Row = {
        "figure": name,
        "n": len(seconds),
        "median_ms": round(sorted(seconds)[len(seconds) // 2] * 1000, 1),
        "p99_ms": "",
        "mb_per_s": round(rates[len(rates) // 2], 1),
        "target": target,
    }
    if baseline is not None:
        out["baseline"] = baseline["figure"]
        out["baseline_median_ms"] = baseline["median_ms"]
        out["baseline_mb_per_s"] = baseline["mb_per_s"]
    return out
