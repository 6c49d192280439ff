"""What the `sandcell` command imports: a guard against the start-up cost creeping back.

`sandcell run -- true` is mostly interpreter and imports (SPEC §16's issue: ≤ 150 ms); each
module named here cost milliseconds on that path before it was kept off it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

# Loaded by the real console entry point, then the modules are written out at exit.
PROBE = """
import atexit, json, sys
out = sys.argv.pop(1)
atexit.register(lambda: open(out, "w").write(json.dumps(sorted(sys.modules))))
from sandcell.cli import main
sys.argv[0] = "sandcell"
if sys.argv[1:]:
    main()
"""

# Never on a client command's path: the async half of the SDK and its event loop, the
# server side, and httpx's own command line (rich, click, pygments; see client/lean_httpx.py).
NOT_FOR_CLIENT_COMMANDS = (
    "asyncio",
    "uvloop",
    "sandcell.client.async_sandbox",
    "sandcell.client.async_transport",
    "sandcell.serve",
    "sandcell.router",
    "sandcell.manager",
    "sandcell.daemon",
    "starlette",
    "uvicorn",
    "httpx._main",
    "rich",
    "click",
    "pygments",
)
# Nor in the command line's module: the SDK and its HTTP client, and typer's pydantic (typer
# needs it to convert the arguments of the command that runs, not to define the commands).
NOT_FOR_THE_COMMAND_LINE = (*NOT_FOR_CLIENT_COMMANDS, "sandcell.client", "httpx", "pydantic")


def _imported(tmp_path: Path, args: list[str], env: dict[str, str] | None = None) -> set[str]:
    out = tmp_path / "modules.json"
    subprocess.run(
        [sys.executable, "-c", PROBE, str(out), *args],
        env=env,
        capture_output=True,
        timeout=60,
    )
    return set(json.loads(out.read_text()))


def _offending(modules: set[str], banned: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == b or m.startswith(f"{b}.") for b in banned))


def test_the_command_line_module_loads_no_client_and_no_asyncio(tmp_path):
    modules = _imported(tmp_path, [])  # `import sandcell.cli`, the console entry's module
    assert "typer" in modules
    assert _offending(modules, NOT_FOR_THE_COMMAND_LINE) == []


def test_version_loads_no_client(tmp_path):
    modules = _imported(tmp_path, ["--version"])
    assert _offending(modules, NOT_FOR_THE_COMMAND_LINE) == []


@pytest.mark.slow
def test_run_loads_only_the_blocking_client(tmp_path, env):
    modules = _imported(tmp_path, ["run", "--", "true"], env)
    assert {"sandcell.client.sandbox", "sandcell.client.transport", "httpx"} <= modules
    assert _offending(modules, NOT_FOR_CLIENT_COMMANDS) == []


def test_the_lazy_command_table_names_what_each_module_registers():
    from sandcell.cli import app
    from sandcell.cli.lazy import commands_of

    homes = app.info.cls.homes
    registered = {name: home for home in set(homes.values()) for name in commands_of(home)}
    assert registered == homes
