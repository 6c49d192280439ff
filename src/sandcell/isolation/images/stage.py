"""A root made of an image, with the daemon's runtime staged read-only beside it (SPEC §12).

The image's top-level entries are bound one by one onto bwrap's own tmpfs root, so the
places sandcell adds (/workspace, /tmp, /proc, /dev, /.sandcell) need no mount point inside
the image and the image is never written. The daemon runs on the host's interpreter and
libraries, not the image's: the host's /usr appears at /.sandcell/usr and the interpreter is
started through the host's dynamic loader with the host's library directory, so images
without Python, with musl, or distroless run the daemon alike. A two-line pyvenv.cfg beside
the interpreter makes it find the venv's site-packages; nothing goes through environment
variables that commands would inherit (PYTHONHOME, LD_LIBRARY_PATH are on the allow-list).
"""

from __future__ import annotations

import os
import posixpath
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import sandcell
from sandcell.cellapi.layout import WORKSPACE_ALIASES
from sandcell.isolation.bwrap import Bind

RUNTIME_DIR = "/.sandcell"
HOST_USR = f"{RUNTIME_DIR}/usr"
VENV = f"{RUNTIME_DIR}/venv"
PYTHON = f"{VENV}/bin/python3"
SRC = f"{RUNTIME_DIR}/src"
# Provided by the cell itself, whatever the image has there.
OWN_ENTRIES = frozenset({"proc", "dev", "tmp", "workspace", "run", RUNTIME_DIR.lstrip("/")})
# /home/<these> are the workspace's names (cellapi.layout), not the image's.
_HOME_OWN = frozenset(posixpath.basename(a) for a in WORKSPACE_ALIASES if a.startswith("/home/"))
# The image's own filesystem's, not the image's (mkfs.ext4 makes it).
HIDDEN_ENTRIES = frozenset({"lost+found"})


class StageError(Exception):
    """The daemon's runtime cannot be staged beside an image on this host."""


@dataclass(frozen=True)
class Staged:
    """`binds` go into the cell; `python` is the daemon's interpreter command inside it, to
    run from `chdir` (where `-m sandcell...` finds the package)."""

    binds: list[Bind]
    python: list[str]
    chdir: str = SRC


def stage_runtime(scratch: Path) -> Staged:
    """The runtime's binds; `scratch` is a directory of the cell's own, for a venv stub:
    pyvenv.cfg, bin/python3 (a link to the host's interpreter as the cell sees it) and a
    mount point for the real venv's lib/."""
    loader = host_python()[:3]
    stub = scratch / "venv"
    (stub / "bin").mkdir(parents=True)
    (stub / "lib").mkdir()
    (stub / "pyvenv.cfg").write_text(
        f"home = {HOST_USR}/bin\ninclude-system-site-packages = false\n"
    )
    (stub / "bin" / "python3").symlink_to(_inside(Path(sys.executable)))
    stub.chmod(0o755)
    binds = [Bind("/usr", HOST_USR), Bind(str(stub), VENV)]
    if sys.prefix != sys.base_prefix:
        binds.append(Bind(str(Path(sys.prefix, "lib")), f"{VENV}/lib"))
    binds.append(Bind(str(Path(sandcell.__file__).resolve().parent.parent), SRC))
    return Staged(binds, [*loader, PYTHON])


def host_python() -> list[str]:
    """The host's interpreter as a command inside an image cell: through the host's loader
    and libraries, whatever libc the image has."""
    base = Path(sys.base_prefix).resolve()
    if base != Path("/usr"):
        raise StageError(f"image cells need the daemon's Python under /usr, not {base}")
    libdir = Path(sysconfig.get_config_var("LIBDIR"))  # Debian's is the multiarch one
    loader = _inside(_loader(libdir))
    return [loader, "--library-path", _inside(libdir), _inside(Path(sys.executable))]


def root_args(
    image_root: str, entries: list[str] | None = None, home: list[str] | None = None
) -> list[str]:
    """bwrap arguments that build / from the image's top-level entries, read-only. /home is
    built from its entries (`home`, listed where the caller can list the image), bar the
    workspace's names there (cellapi.layout: /home/user is the workspace's mount point,
    which a read-only /home could not take)."""
    args: list[str] = []
    for name in entries if entries is not None else sorted(os.listdir(image_root)):
        if name in OWN_ENTRIES or name in HIDDEN_ENTRIES:
            continue
        path = os.path.join(image_root, name)
        if name == "home" and not os.path.islink(path):
            listed = home if home is not None else sorted(os.listdir(path))
            args += _entries_args(path, "/home", [n for n in listed if n not in _HOME_OWN])
        else:
            args += _entries_args(image_root, "", [name])
    return args


def _entries_args(source: str, dest: str, names: list[str]) -> list[str]:
    args: list[str] = []
    for name in names:
        path = os.path.join(source, name)
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), f"{dest}/{name}"]
        else:
            args += ["--ro-bind", path, f"{dest}/{name}"]
    return args


def _loader(libdir: Path) -> Path:
    for pattern in ("ld-linux*.so*", "ld64.so*", "ld-musl*.so*"):
        if found := sorted(libdir.glob(pattern)):
            return found[0]
    raise StageError(f"no dynamic loader in {libdir}")


def _inside(host_path: Path) -> str:
    """A path under the host's /usr as the cell sees it."""
    return f"{HOST_USR}/{host_path.resolve().relative_to('/usr')}"
