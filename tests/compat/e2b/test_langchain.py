"""langchain-e2b's backend (Deep Agents' sandbox operations) on sandcell, with no model call."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from e2b import Sandbox
from langchain_e2b import E2BSandbox

pytestmark = pytest.mark.slow
# Deep Agents' file tools work on /home/user: writes go through the files API, reads, edits,
# ls, grep and glob through commands, which see the same directory there (SPEC §14.2).
ROOT = "/home/user"


@pytest.fixture(scope="module")
def sandbox() -> Iterator[Sandbox]:
    made = Sandbox.create(timeout=300)
    yield made
    made.kill()


@pytest.fixture(scope="module")
def backend(sandbox: Sandbox) -> E2BSandbox:
    return E2BSandbox(sandbox=sandbox)


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


def test_deep_agents_write_then_a_command_reads_it(backend: E2BSandbox, sandbox: Sandbox) -> None:
    """What broke before /home/user was the workspace for commands too: a write through the
    files API, then an edit and a read that run as commands (read-only file system, no such
    file), then `cat` through the sandbox's own commands."""
    assert backend.write(f"{ROOT}/agent/plan.md", "step one\n").error is None
    assert backend.edit(f"{ROOT}/agent/plan.md", "one", "two").error is None
    assert "step two" in str(backend.read(f"{ROOT}/agent/plan.md"))
    assert sandbox.commands.run(f"cat {ROOT}/agent/plan.md").stdout == "step two\n"
    assert sandbox.commands.run("cat agent/plan.md").stdout == "step two\n"  # from the home
    assert sandbox.files.read("/workspace/agent/plan.md") == "step two\n"  # one directory
