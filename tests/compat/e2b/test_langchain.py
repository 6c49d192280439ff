"""langchain-e2b's backend (Deep Agents' sandbox operations) on sandcell, with no model call."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from e2b import Sandbox
from langchain_e2b import E2BSandbox

pytestmark = pytest.mark.slow
# Shell-side operations (ls, read, grep, glob) run commands, and commands see the workspace
# at /workspace (docs/e2b.md); the file API takes that path as well as /home/user.
ROOT = "/workspace"


@pytest.fixture(scope="module")
def backend() -> Iterator[E2BSandbox]:
    sandbox = Sandbox.create(timeout=300)
    yield E2BSandbox(sandbox=sandbox)
    sandbox.kill()


def test_execute(backend: E2BSandbox) -> None:
    ok = backend.execute("echo out; echo err >&2")
    assert ok.exit_code == 0
    assert "out" in ok.output and "err" in ok.output
    assert backend.execute("exit 4").exit_code == 4


def test_files_through_the_backend(backend: E2BSandbox) -> None:
    (uploaded,) = backend.upload_files([(f"{ROOT}/src/app.py", b"print('v1')\n")])
    assert uploaded.error is None
    (downloaded,) = backend.download_files([f"{ROOT}/src/app.py"])
    assert downloaded.content == b"print('v1')\n"
    assert backend.write(f"{ROOT}/src/notes.md", "alpha\nbeta\n").error is None
    assert "beta" in str(backend.read(f"{ROOT}/src/notes.md"))
    assert backend.edit(f"{ROOT}/src/notes.md", "beta", "gamma").error is None
    (text,) = backend.download_files([f"{ROOT}/src/notes.md"])
    assert text.content == b"alpha\ngamma\n"
    listed = str(backend.ls(f"{ROOT}/src"))
    assert "app.py" in listed and "notes.md" in listed
    assert "notes.md" in str(backend.grep("gamma", f"{ROOT}/src"))
    assert "app.py" in str(backend.glob("*.py", f"{ROOT}/src"))
