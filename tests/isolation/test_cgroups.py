"""Cell cgroups on this host's real hierarchies (v1 with controllers, v2 without)."""

import os
import secrets
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sandcell.isolation.cgroups import (
    REQUIRED_CONTROLLERS,
    CellCgroup,
    CgroupDriver,
    CgroupUnavailable,
    CgroupV1Driver,
    CgroupV2Driver,
    Limits,
    detect,
)

LIMITS = Limits(memory_mb=64, pids_max=50, cpus=0.5)
# sh writes its own pid into every procs file, then execs the workload; with set -e a failed
# write stops it before the workload runs unconfined.
ENTER = 'set -e; work=$1; shift; for f; do echo $$ > "$f"; done; exec sh -c "$work"'
_started: list[subprocess.Popen[bytes]] = []


def start_in(cell: CellCgroup, workload: str, reaper: bool = False) -> subprocess.Popen[bytes]:
    """Start ``workload`` in the cell.  With ``reaper``, bwrap's pid-1 init reaps orphans (as
    in a real cell): this host's init does not, and a fork bomb would leave its zombies."""
    cmd = ["sh", "-c", ENTER, "sh", workload, *cell.procs_files]
    if reaper:
        cmd = ["bwrap", "--unshare-pid", "--die-with-parent", "--dev-bind", "/", "/", *cmd]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _started.append(proc)
    return proc


def wait_for(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def assert_gone(cell: CellCgroup) -> None:
    assert not [d for d in cell.dirs if os.path.exists(d)]


def unique_parent() -> str:
    return f"sandcell-test-{secrets.token_hex(4)}"


def clean_up(driver: CgroupDriver) -> None:
    """Even after a failed test: kill what it started (it is all in cells), reap, remove."""
    driver.destroy_all()
    while _started:
        _started.pop().wait(timeout=10)
    assert not [d for d in driver.parent_dirs if os.path.exists(d)]


@pytest.fixture
def v1() -> Iterator[CgroupV1Driver]:
    driver = CgroupV1Driver(parent=unique_parent())
    yield driver
    clean_up(driver)


@pytest.fixture
def v2() -> Iterator[CgroupV2Driver]:
    driver = CgroupV2Driver(parent=unique_parent())
    yield driver
    clean_up(driver)


def read(directory: str, name: str) -> str:
    return Path(directory, name).read_text().strip()


def own_cgroup(controller: str) -> str:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return path.rstrip("/")
    raise AssertionError(controller)


def test_detect_picks_v1_on_this_hybrid_host() -> None:
    driver = detect()
    assert driver.version == 1
    assert driver.describe().startswith("cgroup v1 (memory+memsw, pids, cpu, freezer)")


def test_cells_live_under_our_own_cgroup(v1: CgroupV1Driver) -> None:
    for controller in ("memory", "pids", "cpu", "freezer"):
        own = f"/sys/fs/cgroup/{controller}{own_cgroup(controller)}"
        assert f"{own}/{v1.parent}" in v1.parent_dirs


def test_limits_are_written(v1: CgroupV1Driver) -> None:
    cell = v1.create("limits", LIMITS)
    assert len(cell.procs_files) == 4  # memory, pids, cpu, freezer
    memory, pids, cpu, _ = cell.dirs
    assert read(memory, "memory.limit_in_bytes") == str(64 << 20)
    assert read(memory, "memory.memsw.limit_in_bytes") == str(64 << 20)
    assert read(pids, "pids.max") == "50"
    assert (read(cpu, "cpu.cfs_quota_us"), read(cpu, "cpu.cfs_period_us")) == ("50000", "100000")
    assert v1.list_names() == ["limits"]
    reopened = v1.open("limits")
    assert reopened is not None
    assert reopened.dirs == cell.dirs
    with pytest.raises(FileExistsError):
        v1.create("limits", LIMITS)
    assert os.path.isdir(memory)  # the refused create left the existing cell alone


def test_process_is_counted_then_killed(v1: CgroupV1Driver) -> None:
    cell = v1.create("counted", LIMITS)
    proc = start_in(cell, "exec sleep 60")
    wait_for(lambda: cell.pids() == {proc.pid})
    for procs in cell.procs_files:
        assert Path(procs).read_text().split() == [str(proc.pid)]
    cell.destroy()
    assert proc.wait(timeout=5) == -9
    assert_gone(cell)
    cell.destroy()  # idempotent
    assert v1.open("counted") is None
    assert v1.list_names() == []


def test_fork_bomb_is_contained_then_destroyed(v1: CgroupV1Driver) -> None:
    cell = v1.create("bomb", LIMITS)
    pids_dir = next(d for d in cell.dirs if os.path.exists(os.path.join(d, "pids.events")))
    events = os.path.join(pids_dir, "pids.events")
    # The leader stays: when it exits, bwrap's init exits and the kernel zaps the namespace.
    proc = start_in(cell, "bomb() { bomb | bomb & }; bomb; exec sleep 60", reaper=True)
    wait_for(lambda: Path(events).read_text().split() != ["max", "0"])  # a fork was refused
    assert 0 < int(read(pids_dir, "pids.current")) <= LIMITS.pids_max
    assert cell.pids()
    cell.destroy()
    assert_gone(cell)
    proc.wait(timeout=10)


def test_memory_hog_is_oom_killed_and_counted(v1: CgroupV1Driver) -> None:
    cell = v1.create("hog", Limits(memory_mb=32, pids_max=16, cpus=1.0))
    proc = start_in(cell, "exec /usr/bin/python3 -c 'b = b\"x\" * (256 << 20)'")
    assert proc.wait(timeout=30) == -9
    assert cell.oom_kills() >= 1
    assert 16 << 20 < cell.memory_peak_bytes() <= 32 << 20
    cell.destroy()
    assert_gone(cell)


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "../escape", "x.y", "a\nb", "n" * 129])
def test_names_are_validated(v1: CgroupV1Driver, name: str) -> None:
    with pytest.raises(ValueError, match="invalid cgroup name"):
        v1.create(name, LIMITS)
    with pytest.raises(ValueError, match="invalid cgroup name"):
        v1.open(name)
    with pytest.raises(ValueError, match="invalid cgroup name"):
        CgroupV1Driver(parent=name)


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        Limits(memory_mb=0, pids_max=1, cpus=1.0)


def test_v2_without_controllers_fails_closed_naming_them(v2: CgroupV2Driver) -> None:
    missing = v2.missing_controllers()
    assert missing == list(REQUIRED_CONTROLLERS)  # this host binds them all to v1
    with pytest.raises(CgroupUnavailable) as raised:
        v2.create("limited", LIMITS)
    assert raised.value.missing == REQUIRED_CONTROLLERS
    assert "memory, pids, cpu" in str(raised.value)
    assert not os.path.exists(v2.parent_dirs[0])  # nothing created
    assert "controllers: hugetlb" in v2.describe()


def test_v2_cell_kill_and_destroy(v2: CgroupV2Driver) -> None:
    # Without controllers create() refuses, so make the bare cgroup by hand: cgroup.procs,
    # cgroup.kill and cgroup.freeze are core v2 files, available without any controller.
    os.makedirs(os.path.join(v2.parent_dirs[0], "bare"))
    cell = v2.open("bare")
    assert cell is not None
    assert cell.procs_files == [os.path.join(v2.parent_dirs[0], "bare", "cgroup.procs")]
    proc = start_in(cell, "sleep 60 & sleep 60 & sh -c 'sleep 60 & wait' & wait", reaper=True)
    wait_for(lambda: len(cell.pids()) == 5)  # sh, 2 sleeps, inner sh and its sleep
    assert v2.list_names() == ["bare"]
    cell.kill_all()
    assert cell.pids() == set()
    proc.wait(timeout=10)
    cell.destroy()
    assert_gone(cell)
    assert v2.open("bare") is None
