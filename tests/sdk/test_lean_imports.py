"""What the SDK imports: the blocking client without asyncio, httpx without its command line,
and every public name still where it was."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import sandcell
import sandcell.client


def _modules_after(code: str) -> set[str]:
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return set(json.loads(done.stdout.splitlines()[-1]))


def _under(modules: set[str], *roots: str) -> list[str]:
    return sorted(m for m in modules if any(m == r or m.startswith(f"{r}.") for r in roots))


def test_the_blocking_client_loads_no_async_half():
    modules = _modules_after(
        "from sandcell.client import Sandbox, SandcellError\n"
        "import sandcell.client.transport\n"
        "Sandbox.create  # the class and its operations, built"
    )
    assert {"sandcell.client.sandbox", "sandcell.client.transport", "httpx"} <= modules
    async_half = (
        "asyncio",
        "anyio",
        "sandcell.client.async_sandbox",
        "sandcell.client.async_transport",
    )
    assert _under(modules, *async_half) == []


def test_httpx_comes_without_its_command_line():
    modules = _modules_after("import sandcell.client.transport")
    assert "httpx" in modules
    assert _under(modules, "httpx._main", "rich", "click", "pygments") == []


def test_httpx_stays_whole_for_everyone_else():
    """The mark is gone after the import: httpx's command line still imports on request,
    and an application that imported httpx first keeps it untouched."""
    modules = _modules_after(
        "import sandcell.client.transport, httpx, httpx._main\n"
        "assert httpx.main is not httpx._main.main  # only the console entry is the fallback"
    )
    assert "httpx._main" in modules
    first = _modules_after("import httpx\nimport sandcell.client.transport\nimport httpx._main")
    assert "rich" in first  # httpx's own choice, when the application imported it first


def test_the_async_client_still_imports_on_demand():
    modules = _modules_after("from sandcell.client import AsyncSandbox")
    assert "sandcell.client.async_sandbox" in modules


@pytest.mark.parametrize("name", sandcell.client.__all__)
def test_every_public_name_resolves(name):
    assert getattr(sandcell.client, name) is getattr(sandcell, name, getattr(sandcell.client, name))
    assert name in dir(sandcell.client)


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        sandcell.client.Nope  # noqa: B018
