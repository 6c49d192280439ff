"""Resource limits under real abuse: fork bombs, memory, disk, CPU, a killed daemon (SPEC §3).

Each destructive test gets a cell of its own; the module's teardown checks that destroying
them left nothing on the host.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from cells.conftest import Cell, CellFactory, mounts_under, processes_of_uids, wait_until
from sandcell.isolation.policy import CellPolicy

MiB = 1024 * 1024


@dataclass
class Watch:
    latency: list[float] = field(default_factory=list)  # seconds for a host `true`
    pids: list[int] = field(default_factory=list)  # the cell's pids.current


@contextmanager
def watching(cell: Cell) -> Iterator[Watch]:
    """Every 50 ms while the block runs: time a `true` on the host (is the host responsive?)
    and count the cell's processes (does the limit hold?)."""
    seen = Watch()
    stop = threading.Event()
    current = next(
        Path(d, "pids.current") for d in cell.cgroup.dirs if Path(d, "pids.current").exists()
    )

    def probe() -> None:
        while not stop.is_set():
            start = time.monotonic()
            subprocess.run(["true"], check=True)
            seen.latency.append(time.monotonic() - start)
            with contextlib.suppress(FileNotFoundError):
                seen.pids.append(int(current.read_text()))
            stop.wait(0.05)

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join()


def pids_max_hits(cell: Cell) -> int:
    """How often a fork in the cell was refused by pids.max (v1 and v2: `max N`)."""
    for d in cell.cgroup.dirs:
        events = Path(d, "pids.events")
        if events.exists():
            return int(events.read_text().split()[1])
    raise AssertionError("no pids.events in the cell's cgroups")


def assert_cell_gone(factory: CellFactory, cell: Cell) -> None:
    """Nothing of this one cell on the host: no cgroup, process, mount or directory."""
    cgroup_dirs = cell.cgroup.dirs
    cell_dir = factory.cells.cells_dir / cell.info.cell_id
    cell.destroy()
    assert not [d for d in cgroup_dirs if os.path.exists(d)]
    assert wait_until(lambda: not processes_of_uids({cell.info.uid}), 5), processes_of_uids(
        {cell.info.uid}
    )
    assert mounts_under(cell_dir) == []
    assert not cell_dir.exists()


# -- processes -----------------------------------------------------------------------------


@pytest.mark.slow
def test_fork_bomb_hits_pids_max_and_the_host_stays_responsive(
    factory: CellFactory, make_cell: Callable[..., Cell]
) -> None:
    bomb = make_cell(CellPolicy(memory_mb=256, pids_max=64, disk_mb=32))
    with watching(bomb) as seen:
        start = time.monotonic()
        r = bomb.run(["/bin/bash", "-c", ":(){ :|:& };:; sleep 60"], timeout_s=4)
        elapsed = time.monotonic() - start
    assert r["timed_out"] is True and r["exit_code"] == 124, r
    assert elapsed < 8  # the timeout kills the whole tree, bomb included, and returns
    assert pids_max_hits(bomb) > 0  # the bomb did run into the limit...
    assert max(seen.pids) <= bomb.policy.pids_max  # ...which held all along
    assert len(seen.latency) >= 10 and max(seen.latency) < 1.0, seen.latency
    assert bomb.run("echo alive")["stdout"] == "alive\n"  # the daemon still serves
    assert_cell_gone(factory, bomb)


@pytest.mark.slow
def test_detached_fork_bomb_is_wiped_out_by_destroy(
    factory: CellFactory, make_cell: Callable[..., Cell]
) -> None:
    """A bomb that outlives its command (setsid, in the background) is still the cell's."""
    bomb = make_cell(CellPolicy(memory_mb=256, pids_max=48, disk_mb=32))
    with watching(bomb) as seen:
        r = bomb.sh("setsid sh -c 'b(){ b|b& }; b' >/dev/null 2>&1 < /dev/null & echo started")
        assert r["stdout"] == "started\n"
        assert wait_until(lambda: pids_max_hits(bomb) > 0, 10)
        time.sleep(1)  # the bomb rages on, at the limit
        destroy_start = time.monotonic()
        assert_cell_gone(factory, bomb)
        destroy_s = time.monotonic() - destroy_start
    assert destroy_s < 5
    assert max(seen.pids) <= bomb.policy.pids_max
    assert max(seen.latency) < 1.0, seen.latency


# -- memory --------------------------------------------------------------------------------


def test_memory_past_the_limit_is_oom_killed_and_the_daemon_survives(
    make_cell: Callable[..., Cell],
) -> None:
    cell = make_cell(CellPolicy(memory_mb=128, pids_max=64, disk_mb=32))
    r = cell.py(f"b = bytearray(b'x') * ({2 * cell.policy.memory_mb} * {MiB}); print('got it')")
    assert "got it" not in r["stdout"]
    assert r["exit_code"] == 137 and r["signal"] == 9, r
    assert cell.cgroup.oom_kills() >= 1
    assert cell.cgroup.memory_peak_bytes() <= cell.policy.memory_mb * MiB
    assert cell.run("echo alive")["stdout"] == "alive\n"
    assert cell.owner.cells.alive(cell.info)


# -- disk ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def disk_cell(factory: CellFactory) -> Iterator[Cell]:
    c = factory.create(CellPolicy(memory_mb=256, pids_max=64, disk_mb=32))
    yield c
    c.destroy()


def host_disk_usage(cell: Cell) -> int:
    """Bytes the cell's workspace really takes on the host disk (its sparse image)."""
    image = Path(cell.info.workspace).parent / "disk.img"
    return image.stat().st_blocks * 512


def test_filling_the_workspace_with_one_file_stops_at_the_quota(disk_cell: Cell) -> None:
    quota = disk_cell.policy.disk_mb * MiB
    r = disk_cell.sh(f"dd if=/dev/zero of=/workspace/big bs=1M count={2 * 32} 2>&1")
    assert r["exit_code"] != 0
    assert "No space left on device" in r["stdout"] or "File too large" in r["stdout"], r
    assert os.path.getsize(Path(disk_cell.info.workspace) / "big") <= quota
    assert host_disk_usage(disk_cell) <= quota
    # Past the quota in one file: RLIMIT_FSIZE (fsize = disk quota) stops it even off-disk.
    r = disk_cell.sh(f"head -c {quota + MiB} /dev/zero > /tmp/huge; echo rc=$?")
    assert "rc=0" not in r["stdout"], r
    assert disk_cell.run("echo alive")["stdout"] == "alive\n"
    disk_cell.run("rm -f /workspace/big /tmp/huge")


def test_filling_the_workspace_with_many_files_stops_at_the_quota(disk_cell: Cell) -> None:
    code = """
    import errno, os
    n = 0
    try:
        while n < 200_000:
            with open(f"/workspace/many/f{n}", "wb") as f:
                f.write(b"y" * 4096)
            n += 1
        print("never full")
    except OSError as exc:
        print(errno.errorcode[exc.errno], n)
    """
    disk_cell.run("mkdir -p /workspace/many")
    r = disk_cell.py(code, timeout_s=30)
    name, count = r["stdout"].split()
    assert name in ("ENOSPC", "EDQUOT"), r
    assert int(count) > 100
    assert host_disk_usage(disk_cell) <= disk_cell.policy.disk_mb * MiB
    assert disk_cell.run("echo alive")["stdout"] == "alive\n"
    disk_cell.run("rm -rf /workspace/many")


def test_uploads_past_the_quota_get_413(disk_cell: Cell) -> None:
    quota = disk_cell.policy.disk_mb * MiB
    too_big = disk_cell.client.signed_request(
        "PUT", "/v1/files", params={"path": "up.bin"}, content=b"x" * (quota + MiB)
    )
    assert too_big.status_code == 413, too_big.text
    assert too_big.json()["error"]["code"] == "PAYLOAD_TOO_LARGE"
    # Under the quota by size, but the disk is already nearly full: still 413, not a 500.
    disk_cell.sh("dd if=/dev/zero of=/workspace/filler bs=1M count=28 2>/dev/null")
    no_room = disk_cell.client.signed_request(
        "PUT", "/v1/files", params={"path": "up2.bin"}, content=b"x" * (8 * MiB)
    )
    assert no_room.status_code == 413, no_room.text
    assert host_disk_usage(disk_cell) <= quota
    disk_cell.run("rm -f /workspace/filler /workspace/up.bin /workspace/up2.bin")
    ok = disk_cell.client.signed_request(
        "PUT", "/v1/files", params={"path": "small.bin"}, content=b"x" * MiB
    )
    assert ok.status_code == 200, ok.text


@pytest.mark.parametrize("scratch", ["/tmp", "/dev/shm"])
def test_filling_scratch_space_is_bounded_by_the_cell_memory(
    make_cell: Callable[..., Cell], scratch: str
) -> None:
    """tmpfs pages are charged to the cell: the host never pays more than memory_mb."""
    cell = make_cell(CellPolicy(memory_mb=128, pids_max=64, disk_mb=256))
    script = f"for i in 1 2 3 4 5 6 7 8 9 10; do head -c 30M /dev/zero > {scratch}/f$i; done"
    with contextlib.suppress(httpx.HTTPError):  # the cell may die of it (see the next test)
        cell.sh(script, timeout_s=20)
    assert cell.cgroup.memory_peak_bytes() <= cell.policy.memory_mb * MiB


@pytest.mark.parametrize("scratch", ["/tmp", "/dev/shm"])
def test_filling_scratch_space_gets_enospc_and_the_daemon_survives(
    make_cell: Callable[..., Cell], scratch: str
) -> None:
    cell = make_cell(CellPolicy(memory_mb=128, pids_max=64, disk_mb=256))  # the default ratio
    script = (
        f"for i in 1 2 3 4 5 6 7 8 9 10; do head -c 30M /dev/zero > {scratch}/f$i || break; done;"
        " echo done"
    )
    r = cell.sh(script, timeout_s=20)
    assert "No space left on device" in r["stderr"], r
    assert cell.run("echo alive")["stdout"] == "alive\n"


# -- CPU -----------------------------------------------------------------------------------


def test_cpu_spin_past_the_timeout_is_killed_promptly(make_cell: Callable[..., Cell]) -> None:
    cell = make_cell()
    start = time.monotonic()
    r = cell.py("while True: pass", timeout_s=1)
    elapsed = time.monotonic() - start
    assert r["timed_out"] is True and r["exit_code"] == 124, r
    assert elapsed < 3, elapsed
    # With a child that ignores SIGTERM and keeps the pipes open: still prompt.
    start = time.monotonic()
    r = cell.sh("trap '' TERM; python3 -c 'while True: pass' & while :; do :; done", timeout_s=1)
    assert r["timed_out"] is True and time.monotonic() - start < 3, r
    # Nothing of either is left spinning: only bwrap (pid 1), the daemon and this ps.
    assert wait_until(lambda: len(cell_processes(cell)) == 3, 2), cell_processes(cell)


def cell_processes(cell: Cell) -> list[str]:
    return cell.run(["ps", "-eo", "pid,comm", "--no-headers"])["stdout"].splitlines()


# -- the daemon killed from outside ----------------------------------------------------------


def test_daemon_sigkilled_from_the_host_then_destroy_cleans_up(
    factory: CellFactory, make_cell: Callable[..., Cell]
) -> None:
    cell = make_cell()
    cell.run("sleep 60 >/dev/null 2>&1 &")  # a command's process outlives its request
    assert cell.owner.cells.alive(cell.info)
    os.kill(cell.daemon_pid(), signal.SIGKILL)
    assert wait_until(lambda: not cell.owner.cells.alive(cell.info), 5)
    assert_cell_gone(factory, cell)
