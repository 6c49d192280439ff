"""The Python runtime and sandcell's code, exposed read-only inside every cell.

The host's copies may live where the cell's unprivileged uid cannot reach (root's home is
0700), so the launcher binds them, as root, onto a private stage first; bwrap then binds the
stage into the cell at fixed paths.
"""

from __future__ import annotations

import compileall
import functools
import sys
from dataclasses import dataclass
from pathlib import Path

import sandcell

CELL_VENV = "/opt/sandcell/venv"
CELL_SRC = "/opt/sandcell/src"
SYSTEM_PREFIXES = ("/usr",)


@dataclass(frozen=True)
class RuntimeMount:
    host: str
    cell: str


def runtime_mounts() -> list[RuntimeMount]:
    """What a cell needs to run `python -m sandcell.daemon`: venv, base Python, package."""
    mounts = [RuntimeMount(str(Path(sandcell.__file__).resolve().parent.parent), CELL_SRC)]
    if sys.prefix != sys.base_prefix:
        mounts.append(RuntimeMount(sys.prefix, CELL_VENV))
    base = str(Path(sys.base_prefix).resolve())
    if not base.startswith(SYSTEM_PREFIXES):
        # A Python outside /usr (pyenv, a custom build): visible at its own path, read-only.
        mounts.append(RuntimeMount(base, base))
    return mounts


def cell_python() -> str:
    """The interpreter path inside the cell (the venv's, resolving its pyvenv.cfg there)."""
    if sys.prefix != sys.base_prefix:
        return f"{CELL_VENV}/bin/{Path(sys.executable).name}"
    return str(Path(sys.executable).resolve())


@functools.cache
def compile_package() -> None:
    """Byte code beside sandcell's sources, written once per process that starts cells.

    Cells see the package read-only: without up-to-date `.pyc` files there (an editable
    checkout, `PYTHONDONTWRITEBYTECODE`), every daemon start compiles what it imports again,
    ~25 ms of a cold start. An installed package has its byte code already; where the
    sources are not writable this does nothing."""
    compileall.compile_dir(Path(sandcell.__file__).parent, quiet=2, workers=1)
