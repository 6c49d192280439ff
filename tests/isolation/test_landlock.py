"""Landlock, applied for real in a child interpreter (it is irreversible for the caller)."""

import json
import os
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandcell.isolation.landlock import abi_version

PYTHON = sys.executable  # this checkout's interpreter, wherever it lives

CHILD = """
    import errno, json, os, socket, sys
    from sandcell.isolation.landlock import abi_version, restrict_self

    inside, outside, port, abstract = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    deny_tcp = sys.argv[5] == "deny"
    out = {"abi": abi_version()}

    def attempt(label, fn):
        try:
            fn()
            out[label] = "ok"
        except OSError as exc:
            out[label] = errno.errorcode[exc.errno]

    def write(path):
        with open(path, "w") as f:
            f.write("x")

    def tcp_connect():
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass

    def tcp_bind():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))

    def unix_roundtrip():
        path = os.path.join(inside, "sock")
        with socket.socket(socket.AF_UNIX) as server, socket.socket(socket.AF_UNIX) as client:
            server.bind(path)
            server.listen()
            client.connect(path)

    def abstract_connect():
        with socket.socket(socket.AF_UNIX) as client:
            client.connect("\\0" + abstract)

    out["applied"] = restrict_self([inside, "/dev/null"], deny_tcp=deny_tcp)
    attempt("write inside", lambda: write(os.path.join(inside, "new")))
    attempt("mkdir inside", lambda: os.mkdir(os.path.join(inside, "d")))
    attempt("rename inside", lambda: os.rename(os.path.join(inside, "new"),
                                               os.path.join(inside, "d", "moved")))
    attempt("remove inside", lambda: os.unlink(os.path.join(inside, "d", "moved")))
    attempt("write /dev/null", lambda: write("/dev/null"))
    attempt("write /dev/zero", lambda: write("/dev/zero"))
    attempt("overwrite outside", lambda: write(os.path.join(outside, "existing")))
    attempt("create outside", lambda: write(os.path.join(outside, "new")))
    attempt("truncate outside", lambda: os.truncate(os.path.join(outside, "existing"), 0))
    attempt("mkdir outside", lambda: os.mkdir(os.path.join(outside, "d")))
    attempt("symlink outside", lambda: os.symlink("/", os.path.join(outside, "link")))
    attempt("remove outside", lambda: os.unlink(os.path.join(outside, "existing")))
    attempt("rename outside", lambda: os.rename(os.path.join(outside, "existing"),
                                                os.path.join(outside, "renamed")))
    attempt("move outside in", lambda: os.rename(os.path.join(outside, "existing"),
                                                 os.path.join(inside, "stolen")))
    attempt("read outside", lambda: open(os.path.join(outside, "existing")).read())
    attempt("tcp connect", tcp_connect)
    attempt("tcp bind", tcp_bind)
    attempt("unix socket inside", unix_roundtrip)
    attempt("abstract unix outside", abstract_connect)
    attempt("signal outside", lambda: os.kill(os.getppid(), 0))
    print(json.dumps(out))
"""


@pytest.fixture
def listeners() -> Iterator[tuple[int, str]]:
    """A TCP listener on loopback and an abstract unix listener, both outside the domain."""
    abstract = f"sandcell-test-{os.getpid()}"
    with socket.create_server(("127.0.0.1", 0)) as tcp, socket.socket(socket.AF_UNIX) as unix:
        unix.bind("\0" + abstract)
        unix.listen()
        yield tcp.getsockname()[1], abstract


def run_child(tmp_path: Path, listeners: tuple[int, str], deny_tcp: bool) -> dict[str, object]:
    inside, outside = tmp_path / "inside", tmp_path / "outside"
    inside.mkdir()
    outside.mkdir()
    (outside / "existing").write_text("secret")
    port, abstract = listeners
    proc = subprocess.run(
        [PYTHON, "-c", textwrap.dedent(CHILD), str(inside), str(outside), str(port), abstract,
         "deny" if deny_tcp else "allow"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert (outside / "existing").read_text() == "secret"
    return json.loads(proc.stdout)


def test_writes_confined_and_tcp_denied(tmp_path: Path, listeners: tuple[int, str]) -> None:
    result = run_child(tmp_path, listeners, deny_tcp=True)
    abi = result.pop("abi")
    assert isinstance(abi, int)
    assert abi >= 4
    assert result.pop("applied") == abi
    scoped = "EPERM" if abi >= 6 else "ok"
    assert result == {
        "write inside": "ok",
        "mkdir inside": "ok",
        "rename inside": "ok",
        "remove inside": "ok",
        "write /dev/null": "ok",
        "write /dev/zero": "EACCES",
        "overwrite outside": "EACCES",
        "create outside": "EACCES",
        "truncate outside": "EACCES",
        "mkdir outside": "EACCES",
        "symlink outside": "EACCES",
        "remove outside": "EACCES",
        "rename outside": "EACCES",
        "move outside in": "EACCES",
        "read outside": "ok",
        "tcp connect": "EACCES",
        "tcp bind": "EACCES",
        "unix socket inside": "ok",
        "abstract unix outside": scoped,
        "signal outside": scoped,
    }


def test_tcp_stays_open_unless_denied(tmp_path: Path, listeners: tuple[int, str]) -> None:
    result = run_child(tmp_path, listeners, deny_tcp=False)
    assert (result["tcp connect"], result["tcp bind"]) == ("ok", "ok")
    assert result["create outside"] == "EACCES"


def test_abi_version_reports_landlock() -> None:
    assert abi_version() >= 1


def test_failure_raises_instead_of_degrading(tmp_path: Path) -> None:
    script = textwrap.dedent("""
        import sys
        from sandcell.isolation.landlock import LandlockUnavailable, restrict_self
        try:
            restrict_self([sys.argv[1]], deny_tcp=True)
        except LandlockUnavailable as exc:
            print(exc)
        else:
            print("applied")
    """)
    proc = subprocess.run(
        [PYTHON, "-c", script, str(tmp_path / "missing")],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert proc.stdout.startswith(f"cannot open writable path '{tmp_path / 'missing'}'")
