"""What untrusted code legitimately needs still works inside a cell."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from cells.conftest import Cell


def test_python_and_sh_run(cell: Cell) -> None:
    r = cell.run(["python3", "-c", "import sys, ssl, sqlite3, ctypes; print(sys.version_info[0])"])
    assert (r["exit_code"], r["stdout"]) == (0, "3\n"), r
    r = cell.run("echo $((6 * 7)) | cat")
    assert (r["exit_code"], r["stdout"]) == (0, "42\n"), r
    assert cell.run(["/bin/bash", "-c", "echo ${BASH_VERSION%%.*}"])["stdout"].strip().isdigit()


def test_coreutils(cell: Cell) -> None:
    data = "pear\napple\nfig\n"
    r = cell.sh(
        "mkdir -p cu && cd cu && printf 'pear\\napple\\nfig\\n' > fruit.txt && ls && "
        "cat fruit.txt | sort | head -1 && wc -l < fruit.txt && sha256sum fruit.txt"
    )
    assert r["exit_code"] == 0, r
    listing, first, lines, digest = r["stdout"].splitlines()
    assert (listing, first, lines.strip()) == ("fruit.txt", "apple", "3")
    assert digest.split()[0] == hashlib.sha256(data.encode()).hexdigest()
    assert (Path(cell.info.workspace) / "cu" / "fruit.txt").read_text() == data
    cell.run("rm -rf cu")


def test_a_module_dropped_into_the_workspace_imports(cell: Cell) -> None:
    r = cell.sh(
        "mkdir -p pkgs/mymod && echo 'ANSWER = 42' > pkgs/mymod/__init__.py && "
        "PYTHONPATH=/workspace/pkgs python3 -c 'import mymod; print(mymod.ANSWER, mymod.__file__)'"
    )
    assert r["stdout"] == "42 /workspace/pkgs/mymod/__init__.py\n", r
    # The same through the request's env (the daemon's allow-list does not stand in the way).
    r = cell.run(
        ["python3", "-c", "import mymod; print(mymod.ANSWER)"],
        env={"PYTHONPATH": "/workspace/pkgs"},
    )
    assert r["stdout"] == "42\n", r
    cell.run("rm -rf pkgs")


@pytest.mark.slow
def test_pip_works_offline_for_local_packages(cell: Cell) -> None:
    assert cell.run("python3 -m pip --version")["stdout"].startswith("pip ")
    r = cell.sh(
        "mkdir -p src/hello && echo 'def hi(): return \"hi\"' > src/hello/__init__.py && "
        'printf \'from setuptools import setup\\nsetup(name="hello", version="1.0", '
        'packages=["hello"])\\n\' > src/setup.py && '
        "python3 -m pip install -q --no-index --no-build-isolation --target /workspace/site "
        "./src 2>&1 && PYTHONPATH=/workspace/site python3 -c 'import hello; print(hello.hi())'",
        timeout_s=60,
    )
    assert r["exit_code"] == 0 and r["stdout"].endswith("hi\n"), r
    # The network is not there: an index download fails (fast), it does not hang.
    r = cell.run(
        "python3 -m pip download -q --retries 0 --timeout 2 -d /tmp/dl requests", timeout_s=30
    )
    assert r["exit_code"] != 0 and not r["timed_out"], r
    cell.run("rm -rf src site")


def test_venv_in_the_workspace(cell: Cell) -> None:
    r = cell.sh(
        "python3 -m venv --without-pip /workspace/venv && "
        "/workspace/venv/bin/python -c 'import sys; print(sys.prefix != sys.base_prefix)'"
    )
    assert r["stdout"] == "True\n", r
    cell.run("rm -rf venv")


def test_tmp_dev_null_and_home(cell: Cell) -> None:
    r = cell.sh(
        "echo scratch > /tmp/t && cat /tmp/t && rm /tmp/t && "
        "echo gone > /dev/null && head -c 3 /dev/zero | wc -c && "
        "head -c 8 /dev/urandom | wc -c && echo $HOME && cd && pwd && touch ~/.rc && ls -a ~"
    )
    assert r["exit_code"] == 0, r
    lines = r["stdout"].splitlines()
    assert lines[:5] == ["scratch", "3", "8", "/workspace", "/workspace"], r
    assert ".rc" in lines
    python_tmp = cell.py(
        "import tempfile; f = tempfile.NamedTemporaryFile(); f.write(b'x'); print(f.name[:5])"
    )
    assert python_tmp["stdout"] == "/tmp/\n", python_tmp
    cell.run("rm -f .rc")


def test_identity_and_hostname_look_ordinary(cell: Cell) -> None:
    r = cell.sh("id -un; id -u; hostname; cat /etc/hostname; echo $PATH")
    assert r["stdout"].splitlines() == [
        "sandbox",
        "1000",
        "sandcell",
        "sandcell",
        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    ], r


def test_threads_subprocesses_and_pipes(cell: Cell) -> None:
    code = """
    import concurrent.futures, multiprocessing, subprocess
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        threads = sum(pool.map(lambda n: n, range(10)))
    with multiprocessing.Pool(2) as pool:
        procs = sum(pool.map(abs, [-1, -2, -3]))
    out = subprocess.run(["sh", "-c", "echo a | tr a b"], capture_output=True, text=True).stdout
    print(threads, procs, out.strip())
    """
    r = cell.py(code, timeout_s=30)
    assert r["stdout"] == "45 6 b\n", r
