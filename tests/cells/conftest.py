"""Fixtures for the cell security suite: real cells (bwrap, cgroups, loop disks), run as root.

Every module gets its own cgroup parent (``sandcell-test-<random>``) and cells directory; all
cells are destroyed by the fixture that made them, and the module's teardown then checks that
nothing of them is left on the host: no cell directory, no cgroup, no mount, no process.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from sandcell import tokens
from sandcell.cellapi.client import DaemonClient
from sandcell.isolation import cgroups
from sandcell.isolation.cell import (
    DEFAULT_UID_BASE,
    DEFAULT_UID_COUNT,
    CellInfo,
    LocalCells,
    new_cell_id,
)
from sandcell.isolation.images.stage import host_python
from sandcell.isolation.policy import CellPolicy

CELL_UIDS = range(DEFAULT_UID_BASE, DEFAULT_UID_BASE + DEFAULT_UID_COUNT)
# Small enough to start fast, large enough for python3 and pip.
DEFAULT_POLICY = CellPolicy(memory_mb=256, pids_max=64, disk_mb=64)
# Every cgroup parent this suite made: its last check looks for all of them.
_SUITE_PARENTS: list[str] = []


def cells_unsupported() -> str:
    """Why real cells cannot run here ("" when they can)."""
    if os.geteuid() != 0:
        return "cells need root"
    missing = [t for t in ("bwrap", "setpriv", "unshare", "mkfs.ext4") if shutil.which(t) is None]
    return f"cells need {', '.join(missing)}" if missing else ""


requires_cells = pytest.mark.skipif(bool(cells_unsupported()), reason=cells_unsupported())


@dataclass
class Cell:
    """A started, initialised cell and a client holding its session key."""

    info: CellInfo
    client: DaemonClient
    policy: CellPolicy
    sandbox_id: str
    owner: CellFactory = field(repr=False)
    python: tuple[str, ...] = ("/usr/bin/python3",)  # an image cell's is the staged runtime

    def run(self, command: str | list[str], timeout_s: float = 20, **fields: Any) -> dict:
        return self.client.exec(command, timeout_s=timeout_s, **fields)

    def sh(self, script: str, timeout_s: float = 20, **fields: Any) -> dict:
        return self.run(["/bin/sh", "-c", script], timeout_s=timeout_s, **fields)

    def py(self, code: str, *args: str, timeout_s: float = 20, **fields: Any) -> dict:
        return self.run(
            [*self.python, "-c", textwrap.dedent(code), *args], timeout_s=timeout_s, **fields
        )

    def py_json(self, code: str, *args: str, timeout_s: float = 20, **fields: Any) -> Any:
        """Runs a probe that prints one JSON document; fails the test if it did not."""
        r = self.py(code, *args, timeout_s=timeout_s, **fields)
        assert r["exit_code"] == 0, r
        return json.loads(r["stdout"])

    @property
    def cgroup(self) -> cgroups.CellCgroup:
        """Found from the host's side, by a driver of our own (not the one that made it)."""
        assert self.info.cgroup is not None
        cg = cgroups.detect(self.owner.parent).open(self.info.cgroup)
        assert cg is not None, f"cgroup of {self.info.cell_id} is gone"
        return cg

    def host_pids(self) -> set[int]:
        return self.cgroup.pids()

    def daemon_pid(self) -> int:
        """The daemon's host pid, found among the cell's processes by its command line."""
        for pid in self.host_pids():
            argv = read_proc(pid, "cmdline").split(b"\0")
            # bwrap's own command line holds the daemon's too: look for the python itself.
            if b"bwrap" not in argv[0] and b"sandcell.daemon" in argv:
                return pid
        raise AssertionError("no daemon process in the cell's cgroup")

    def destroy(self) -> None:
        self.owner.destroy(self)


class CellFactory:
    """One LocalCells (its own directory and cgroup parent) and every cell made through it."""

    def __init__(self, root: Path, parent: str) -> None:
        self.root, self.parent = root, parent
        self.cells = LocalCells(root / "cells", cgroup_parent=parent)
        self.live: dict[str, Cell] = {}
        self.uids: set[int] = set()

    def create(self, policy: CellPolicy = DEFAULT_POLICY, *, init: bool = True) -> Cell:
        bootstrap, session = tokens.generate_p256(), tokens.generate_p256()
        cell_id, sandbox_id = new_cell_id(), f"sbx-{secrets.token_hex(4)}"
        info = self.cells.create(cell_id, policy, sandbox_id, tokens.public_pem(bootstrap))
        client = DaemonClient({"uds": info.uds}, sandbox_id, session, timeout_s=60)
        python = tuple(host_python()) if policy.image_root else Cell.python
        cell = Cell(info, client, policy, sandbox_id, self, python)
        self.live[cell_id] = cell
        self.uids.add(info.uid)
        if init:
            token = tokens.mint_bootstrap_token(bootstrap, sandbox_id, tokens.public_pem(session))
            response = client.init(token)
            assert response.status_code == 200, response.text
        return cell

    def destroy(self, cell: Cell) -> None:
        cell.client.close()
        self.cells.destroy(cell.info.cell_id)
        self.live.pop(cell.info.cell_id, None)

    def close(self) -> None:
        for cell in list(self.live.values()):
            self.destroy(cell)


# -- host-side observations ------------------------------------------------------------------


def read_proc(pid: int, name: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/{name}").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return b""


def status_ids(pid: int) -> dict[str, list[int]]:
    """The Uid/Gid lines of /proc/PID/status: real, effective, saved, filesystem."""
    ids: dict[str, list[int]] = {}
    for line in read_proc(pid, "status").decode(errors="replace").splitlines():
        key, _, value = line.partition(":")
        if key in ("Uid", "Gid"):
            ids[key] = [int(v) for v in value.split()]
    return ids


def is_zombie(pid: int) -> bool:
    stat = read_proc(pid, "stat")
    return stat[stat.rfind(b")") + 2 :][:1] == b"Z"


def processes_of_uids(uids: range | set[int]) -> dict[int, str]:
    """Live host processes whose real or effective uid is in ``uids``.

    Zombies are left out: they run nothing and hold nothing but their pid until their
    parent reaps them. When a cell is destroyed, its pid-1 bwrap can outlive its parent by
    an instant and be handed to the host's init, which on some hosts reaps only lazily.
    """
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or is_zombie(pid := int(entry.name)):
            continue
        ids = status_ids(pid).get("Uid")
        if ids and (ids[0] in uids or ids[1] in uids):
            found[pid] = read_proc(pid, "cmdline").decode(errors="replace")
    return found


def foreign_cell(pid: int, ours: list[str]) -> bool:
    """True for a process in a cell of another sandcell instance (another suite, a server):
    not ours to judge. Ours, or one that left every sandcell cgroup, is judged."""
    groups = read_proc(pid, "cgroup").decode(errors="replace")
    in_sandcell = "/sandcell" in groups
    return in_sandcell and not any(f"/{parent}/" in groups for parent in ours)


def mounts_under(path: Path) -> list[str]:
    return [line for line in Path("/proc/mounts").read_text().splitlines() if str(path) in line]


def wait_until(done: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def assert_nothing_left(factory: CellFactory) -> None:
    """The leak check: no cell dir, no cgroup, no mount, no process of any of its cells."""
    cells_dir = factory.cells.cells_dir
    assert list(cells_dir.iterdir()) == [], "cell directories left behind"
    driver = cgroups.detect(factory.parent)
    assert driver.list_names() == [], f"cgroups left under {factory.parent}"
    assert mounts_under(factory.root) == [], "mounts left behind"

    def left() -> dict[int, str]:
        """Uids are recycled: another sandcell's cell may hold one of ours by now."""
        procs = processes_of_uids(factory.uids)
        return {p: c for p, c in procs.items() if not foreign_cell(p, [factory.parent])}

    assert wait_until(lambda: not left(), 5), f"processes of the cells' uids left: {left()}"


# -- fixtures ------------------------------------------------------------------------------


def new_cgroup_parent() -> str:
    """A fresh parent group name, remembered for the suite's final leak check."""
    parent = f"sandcell-test-{secrets.token_hex(4)}"
    _SUITE_PARENTS.append(parent)
    return parent


@pytest.fixture(scope="module")
def cgroup_parent() -> Iterator[str]:
    if why := cells_unsupported():
        pytest.skip(why)
    parent = new_cgroup_parent()
    yield parent
    driver = cgroups.detect(parent)
    driver.destroy_all()
    assert not [d for d in driver.parent_dirs if os.path.exists(d)]


@pytest.fixture(scope="module")
def cells_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cells")


@pytest.fixture(scope="module")
def factory(cells_root: Path, cgroup_parent: str) -> Iterator[CellFactory]:
    """The module's cells; at the end, all destroyed and nothing of them left."""
    f = CellFactory(cells_root, cgroup_parent)
    try:
        yield f
    finally:
        f.close()
    assert_nothing_left(f)


@pytest.fixture(scope="module")
def cell(factory: CellFactory) -> Iterator[Cell]:
    """A cell of the default-ish policy shared by a module (for non-destructive tests)."""
    c = factory.create()
    yield c
    c.destroy()


@pytest.fixture
def make_cell(factory: CellFactory) -> Iterator[Callable[..., Cell]]:
    """Cells of a test's own (destructive tests), destroyed when the test ends."""
    made: list[Cell] = []

    def make(policy: CellPolicy = DEFAULT_POLICY, **kwargs: Any) -> Cell:
        c = factory.create(policy, **kwargs)
        made.append(c)
        return c

    yield make
    for c in made:
        c.destroy()


@pytest.fixture
def host_sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A host process (root) that no cell may touch."""
    proc = subprocess.Popen(["sleep", "300"], stdin=subprocess.DEVNULL)
    yield proc
    proc.kill()
    proc.wait()


@pytest.fixture(scope="package", autouse=True)
def no_cell_leaks_after_the_suite() -> Iterator[None]:
    """After all of tests/cells: no cgroup parent of ours remains, and no process runs under a
    cell uid unless it belongs to a cell of some other sandcell instance on this host."""
    yield
    for parent in _SUITE_PARENTS:
        driver = cgroups.detect(parent)
        assert not [d for d in driver.parent_dirs if os.path.exists(d)], parent

    def leaked() -> dict[int, str]:
        procs = processes_of_uids(CELL_UIDS)
        return {p: c for p, c in procs.items() if not foreign_cell(p, _SUITE_PARENTS)}

    assert wait_until(lambda: not leaked(), 5), f"cell processes outlive the suite: {leaked()}"
