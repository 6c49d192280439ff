"""The daemon's runtime as a relocatable directory, for pods of any image (SPEC §12).

On Kubernetes a template's `image.oci` is the pod's image; it need not have Python. An init
container from sandcell's daemon image runs `python -m sandcell.isolation.images.inject DIR`,
copying the running interpreter, its standard library, the daemon's packages and every
shared library they load (the dynamic loader included) into DIR, a volume the pod's
container then mounts read-only at RUNTIME_MOUNT and starts the daemon from:

    DIR/lib/ld.so, DIR/lib/*.so*      the dynamic loader and the libraries (as ldd finds them)
    DIR/python/bin/python             the interpreter, with python._pth beside it
    DIR/python/lib/python3.X/...      the standard library, lib-dynload, site-packages

The loader and interpreter have fixed names, so the server writes the pod's command without
knowing the daemon image's Python version or libc.

The `._pth` file fixes sys.path relative to the interpreter (so the tree works wherever it
is mounted) and puts Python in isolated mode: no PYTHON* variable from the image's
environment reaches the daemon, and none is needed (LD_LIBRARY_PATH neither: the loader is
told its library path on the command line).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from importlib import metadata
from pathlib import Path

import sandcell

RUNTIME_MOUNT = "/.sandcell"
_VERSION = f"python{sys.version_info.major}.{sys.version_info.minor}"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # a PEP 508 requirement starts with its name
_SKIP = shutil.ignore_patterns("__pycache__", "test", "tests", "idlelib", "tkinter", "ensurepip")


def daemon_command(mount: str = RUNTIME_MOUNT) -> list[str]:
    """The daemon's interpreter command for a runtime copied by `inject` and mounted at
    `mount`; the caller appends `-m sandcell.daemon ARGS`."""
    python = f"{mount}/python/bin/python"
    return [f"{mount}/lib/ld.so", "--library-path", f"{mount}/lib", python, "-s", "-B"]


def inject(dest: Path) -> None:
    """Copies the runtime into the empty or missing directory `dest`."""
    python_dir = dest / "python"
    stdlib = python_dir / "lib" / _VERSION
    site = stdlib / "site-packages"
    interpreter = python_dir / "bin" / "python"
    (python_dir / "bin").mkdir(parents=True)
    shutil.copy2(Path(sys.executable).resolve(), interpreter)
    shutil.copytree(sysconfig.get_path("stdlib"), stdlib, ignore=_SKIP, symlinks=True)
    dynload = Path(sysconfig.get_path("platstdlib"), "lib-dynload")
    if not (stdlib / "lib-dynload").exists():
        shutil.copytree(dynload, stdlib / "lib-dynload")
    for distribution in _daemon_distributions():
        _copy_distribution(distribution, site)
    package = Path(sandcell.__file__).resolve().parent
    if not (site / "sandcell").exists():  # an editable install: its files are elsewhere
        shutil.copytree(package, site / "sandcell", ignore=_SKIP)
    pth = [f"../lib/{_VERSION}{sub}" for sub in ("", "/lib-dynload", "/site-packages")]
    (python_dir / "bin" / "python._pth").write_text("\n".join(pth) + "\n")
    _copy_libraries(dest / "lib", [interpreter, *python_dir.rglob("*.so*")])
    for path in dest.rglob("*"):  # not dest itself: the volume is not ours to chmod
        if not path.is_symlink():
            path.chmod(0o755 if path.is_dir() or os.access(path, os.X_OK) else 0o644)


def _daemon_distributions() -> list[metadata.Distribution]:
    """sandcell's distribution and those it requires, transitively, without extras (a
    requirement not installed here is one whose marker excluded it)."""
    seen: dict[str, metadata.Distribution] = {}
    todo = ["sandcell"]
    while todo:
        name = todo.pop()
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        key = dist.metadata["Name"].lower().replace("_", "-")
        if key in seen:
            continue
        seen[key] = dist
        for spec in dist.requires or []:
            name_match = _NAME.match(spec)
            if name_match and "extra" not in spec.partition(";")[2]:
                todo.append(name_match[0])
    return list(seen.values())


def _copy_distribution(dist: metadata.Distribution, site: Path) -> None:
    for file in dist.files or []:
        source = Path(str(dist.locate_file(file))).resolve()
        if file.parts[0] == ".." or "__pycache__" in file.parts or not source.is_file():
            continue  # scripts installed outside site-packages, bytecode, editable hooks
        target = site / file
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)


def _copy_libraries(libdir: Path, binaries: list[Path]) -> None:
    """Every shared library the binaries load, as ldd resolves it, under its soname; the
    loader itself as ld.so."""
    libdir.mkdir()
    for binary in binaries:
        out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True).stdout
        for line in out.splitlines():  # "soname => /path (0x...)", or "/loader (0x...)"
            name, arrow, rest = line.strip().partition(" => ")
            name = name.split(" (")[0]
            path = rest.split(" (")[0] if arrow else name
            target = libdir / (Path(name).name if arrow else "ld.so")
            if path.startswith("/") and not target.exists():
                shutil.copy2(path, target)


if __name__ == "__main__":
    inject(Path(sys.argv[1]))
