"""Fail closed: a layer the policy needs but the host cannot enforce stops creation, naming
the layer, and leaves nothing behind (SPEC §3). No mocks: the conditions are real ones (an
unprivileged caller cannot loop-mount a disk or make cgroups; names the kernel refuses)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from cells.conftest import CellFactory, mounts_under, new_cgroup_parent, requires_cells
from sandcell import tokens
from sandcell.isolation import cgroups
from sandcell.isolation.cell import (
    DEFAULT_UID_BASE,
    DEFAULT_UID_COUNT,
    UID_REGISTRY,
    CellError,
    LocalCells,
    new_cell_id,
)
from sandcell.isolation.policy import LAYERS, CellPolicy, IsolationUnavailable
from support.leaks import outside_prefix

NOBODY = 65534


# -- the policy's rule ---------------------------------------------------------------------


def test_require_raises_naming_the_layer_unless_degraded() -> None:
    strict = CellPolicy()
    assert strict.require("seccomp", True, "") is True
    with pytest.raises(IsolationUnavailable) as info:
        strict.require("landlock", False, "the kernel has no Landlock")
    assert info.value.layer == "landlock"
    assert "landlock" in str(info.value) and "no Landlock" in str(info.value)
    lenient = CellPolicy(allow_degraded=frozenset({"landlock"}))
    assert lenient.require("landlock", False, "the kernel has no Landlock") is False
    with pytest.raises(IsolationUnavailable, match="cgroups"):
        lenient.require("cgroups", False, "no memory controller")  # only what was allowed


@pytest.mark.parametrize("layer", LAYERS)
def test_every_layer_fails_closed_by_default(layer: str) -> None:
    with pytest.raises(IsolationUnavailable) as info:
        CellPolicy().require(layer, False, "missing here")
    assert info.value.layer == layer


def test_unknown_layer_in_allow_degraded_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="apparmor"):
        CellPolicy(allow_degraded=frozenset({"apparmor"}))
    with pytest.raises(ValueError, match="network"):
        CellPolicy(network="host")


# -- real conditions, end to end -------------------------------------------------------------


UNPRIVILEGED_CREATE = """
import json, os, sys
from pathlib import Path
from sandcell import tokens
from sandcell.isolation.cell import LocalCells
from sandcell.isolation.policy import CellPolicy, IsolationUnavailable
cells_dir, parent, degraded = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
cells = LocalCells(Path(cells_dir), cgroup_parent=parent)
policy = CellPolicy(memory_mb=128, disk_mb=16, allow_degraded=frozenset(degraded))
try:
    info = cells.create("c1", policy, "sbx-1", tokens.public_pem(tokens.generate_p256()))
    cells.destroy("c1")
    out = {"outcome": "created"}
except IsolationUnavailable as exc:
    out = {"outcome": "IsolationUnavailable", "layer": exc.layer, "message": str(exc)}
except Exception as exc:
    out = {"outcome": type(exc).__name__, "message": str(exc)}
out["left"] = sorted(os.listdir(cells_dir))
print(json.dumps(out))
"""


@pytest.fixture
def unprivileged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """A cells directory owned by nobody (where nobody can reach it: pytest's own temporary
    directories are root's, 0700), and a fresh cgroup parent name. Its name is the
    session's (leaks.outside_prefix): the session's leak check knows its cells by it."""
    prefix = outside_prefix(tmp_path_factory.getbasetemp())
    home = Path(tempfile.mkdtemp(prefix=prefix))
    home.chmod(0o755)
    os.chown(home, NOBODY, NOBODY)
    parent = new_cgroup_parent()
    try:
        yield home / "cells", parent
    finally:
        shutil.rmtree(home)
        driver = cgroups.detect(parent)
        driver.destroy_all()
    assert not [d for d in driver.parent_dirs if os.path.exists(d)]


def create_as_nobody(cells_dir: Path, parent: str, degraded: list[str]) -> dict:
    """LocalCells.create run by an unprivileged user: the real condition, not a mock."""
    src = Path(__file__).resolve().parents[2] / "src"
    r = subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--",
         sys.executable, "-c", textwrap.dedent(UNPRIVILEGED_CREATE),
         str(cells_dir), parent, json.dumps(degraded)],
        capture_output=True, text=True, timeout=60, cwd="/",
        env={"PATH": os.environ["PATH"], "HOME": str(cells_dir.parent), "PYTHONPATH": str(src)},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@requires_cells
def test_disk_quota_unavailable_to_an_unprivileged_caller(unprivileged: tuple[Path, str]) -> None:
    cells_dir, parent = unprivileged
    result = create_as_nobody(cells_dir, parent, [])
    assert result["outcome"] == "IsolationUnavailable", result
    assert result["layer"] == "disk_quota"
    assert "disk_quota" in result["message"] and "root" in result["message"]
    assert result["left"] == []  # no cell directory remains
    assert cgroups.detect(parent).list_names() == []


@requires_cells
def test_cgroups_unavailable_to_an_unprivileged_caller_names_the_layer(
    unprivileged: tuple[Path, str],
) -> None:
    cells_dir, parent = unprivileged
    result = create_as_nobody(cells_dir, parent, ["disk_quota"])
    assert result["left"] == []
    assert result["outcome"] == "IsolationUnavailable", result
    assert result["layer"] == "cgroups"


@requires_cells
def test_an_unprivileged_caller_gets_a_cell_where_layers_may_degrade(
    unprivileged: tuple[Path, str],
) -> None:
    """The non-root launch (no stage, no uid change) still starts a cell, and destroys it."""
    cells_dir, parent = unprivileged
    result = create_as_nobody(cells_dir, parent, ["disk_quota", "cgroups"])
    assert result == {"outcome": "created", "left": []}


@requires_cells
def test_invalid_cgroup_parent_is_refused_before_anything_is_made(tmp_path: Path) -> None:
    for parent in ("../escape", "a/b", "", "x" * 200, "sandcell test"):
        with pytest.raises(ValueError, match="cgroup name"):
            LocalCells(tmp_path / "cells", cgroup_parent=parent)
    assert list((tmp_path / "cells").iterdir()) == []
    # "../escape" would have landed beside our own group: it did not.
    own_dirs = [os.path.dirname(d) for d in cgroups.detect("x").parent_dirs]
    assert not any(os.path.exists(os.path.join(d, "..", "escape")) for d in own_dirs)


@pytest.fixture
def factory_fc(tmp_path: Path) -> Iterator[CellFactory]:
    parent = new_cgroup_parent()
    f = CellFactory(tmp_path, parent)
    yield f
    f.close()
    cgroups.detect(parent).destroy_all()


@requires_cells
def test_a_socket_path_too_long_fails_cleanly(tmp_path: Path) -> None:
    """The manager binds the daemon's socket itself: a too deep cells directory is a clear
    CellError before anything starts, and nothing is left."""
    parent = new_cgroup_parent()
    cells = LocalCells(tmp_path / ("d" * 100) / "cells", cgroup_parent=parent)
    try:
        with pytest.raises(CellError, match=r"daemon's socket.*too long"):
            cells.create(new_cell_id(), CellPolicy(memory_mb=128, disk_mb=16), "sbx-x", _pem())
    finally:
        cgroups.detect(parent).destroy_all()
    assert list(cells.cells_dir.iterdir()) == []
    assert mounts_under(tmp_path) == []


@requires_cells
def test_a_cell_that_cannot_start_leaves_nothing_behind(factory_fc: CellFactory) -> None:
    """Memory too small for the daemon itself: start-up fails, and the cleanup is complete."""
    cells = factory_fc.cells
    with pytest.raises(CellError, match=r"start-up|healthy"):
        cells.create(new_cell_id(), CellPolicy(memory_mb=8, disk_mb=16), "sbx-x", _pem())
    assert list(cells.cells_dir.iterdir()) == []
    assert cgroups.detect(factory_fc.parent).list_names() == []
    assert mounts_under(factory_fc.root) == []


@requires_cells
def test_out_of_cell_uids_fails_cleanly(tmp_path: Path) -> None:
    parent = new_cgroup_parent()
    # One uid, from the top of the range: the bottom is where other sandcells on this host
    # (a server, another test session) take theirs.
    top = DEFAULT_UID_BASE + DEFAULT_UID_COUNT - 1
    base = next(u for u in range(top, top - 100, -1) if not (UID_REGISTRY / str(u)).exists())
    cells = LocalCells(tmp_path / "cells", cgroup_parent=parent, uid_base=base, uid_count=1)
    first = new_cell_id()
    try:
        cells.create(first, CellPolicy(memory_mb=128, disk_mb=16), "sbx-1", _pem())
        with pytest.raises(CellError, match="uid"):
            cells.create(new_cell_id(), CellPolicy(memory_mb=128, disk_mb=16), "sbx-2", _pem())
        assert [c.name for c in cells.cells_dir.iterdir()] == [first]
    finally:
        cells.destroy(first)
        cgroups.detect(parent).destroy_all()
    assert list(cells.cells_dir.iterdir()) == []
    assert mounts_under(tmp_path) == []


def _pem() -> bytes:
    return tokens.public_pem(tokens.generate_p256())
