"""Agent frameworks' E2B integrations on sandcell, each driven without a model (docs/e2b.md's
matrix): openai-agents' sandbox client and crewai-tools' E2B tools in session venvs of their
own, since their pins conflict with the test venv (websockets<17 and e2b 2.31; pydantic<2.13
and e2b 2.20), and agno's E2BTools in the test venv. The venv flows are framework_flows.py,
run once per framework; each test below reads one part's outcome."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from agno.tools.e2b import E2BTools

from compat.e2b.venvs import run_python, session_venv
from sdk.helpers import served
from support.server import SMALL_TEMPLATE, RunningServer
from support.tls_front import make_certificates

DOMAIN = "sandboxes.test"  # the per-sandbox hosts' domain, resolved by resolve/sitecustomize.py
pytestmark = pytest.mark.slow
FLOWS = Path(__file__).with_name("framework_flows.py")
OPENAI_AGENTS = ["openai-agents[e2b]==0.24.0"]  # with its pins, e2b 2.31.0 and ci 2.8.1
# Its e2b extra asks e2b~=2.20.0 and e2b-code-interpreter~=2.6.0: pinned to what those give.
CREWAI_TOOLS = ["crewai-tools[e2b]==1.15.30", "e2b==2.20.3", "e2b-code-interpreter==2.6.2"]


def run_flow(python: Path, name: str, env: dict[str, str], home: Path) -> dict[str, str]:
    """The flow's parts and their outcomes. The framework gets a home of its own: crewai keeps
    credentials and a data folder per working directory under ~/.local/share and ~/.config."""
    dirs = {"HOME": home, "XDG_DATA_HOME": home / "share", "XDG_CONFIG_HOME": home / "config"}
    done = run_python(python, [FLOWS, name], {**env, **{k: str(v) for k, v in dirs.items()}})
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def openai_agents(
    tmp_path_factory: pytest.TempPathFactory, e2b_native_env: dict[str, str]
) -> dict[str, str]:
    # Its e2b 2.31 takes only keys of the form e2b_<hex>: one from `keys create --e2b`, as
    # docs/e2b.md tells its users; no trace export (no model either).
    python = session_venv(tmp_path_factory, OPENAI_AGENTS)
    env = {**e2b_native_env, "OPENAI_AGENTS_DISABLE_TRACING": "1"}
    return run_flow(python, "openai_agents", env, tmp_path_factory.mktemp("home"))


@pytest.fixture(scope="module")
def crewai_tools(
    tmp_path_factory: pytest.TempPathFactory, e2b_env: dict[str, str]
) -> dict[str, str]:
    python = session_venv(tmp_path_factory, CREWAI_TOOLS)
    env = {**e2b_env, "CREWAI_DISABLE_TELEMETRY": "true"}  # nothing leaves the machine
    return run_flow(python, "crewai_tools", env, tmp_path_factory.mktemp("home"))


@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    "part",
    [
        "session",  # exec, write, read, ls, an exit code, in /workspace
        "pause_and_resume",  # pause_on_exit, then client.resume() finds it and its files
        "hydrate_workspace",  # its tar goes to /tmp through the files API
    ],
)
def test_openai_agents(openai_agents: dict[str, str], part: str) -> None:
    assert openai_agents[part] == "ok", openai_agents[part]


@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    "part",
    [
        "exec_tool",  # a sandbox per call, killed after it
        "file_tool",  # persistent: write, read, append, list, info, delete, exists
        "attached",  # sandbox_id=: Sandbox.connect through e2b 2.20.3
    ],
)
def test_crewai_tools(crewai_tools: dict[str, str], part: str) -> None:
    assert crewai_tools[part] == "ok", crewai_tools[part]


@pytest.fixture(scope="module")
def e2b_hosts_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """sandcell as E2B's hosts: TLS on its listener and `{port}-{id}.{DOMAIN}` routed."""
    root = tmp_path_factory.mktemp("e2b-hosts")
    ca, cert, key = make_certificates(DOMAIN, root / "pki")
    config = (
        f'[server]\npreview_domain = "{DOMAIN}"\n'
        f'tls_cert_file = "{cert}"\ntls_key_file = "{key}"\n' + SMALL_TEMPLATE.format(warm_pool=1)
    )
    yield from served(root, config_text=config, tls_ca=ca)


@pytest.mark.timeout(900)
def test_crewai_python_tool_on_e2b_hosts(
    tmp_path_factory: pytest.TempPathFactory, e2b_hosts_server: RunningServer
) -> None:
    """e2b-code-interpreter <= 2.6 builds https://49999-<id>.<E2B_DOMAIN> itself, with no
    option to point it elsewhere: where wildcard DNS names sandcell, it works. The test's
    wildcard DNS is tests/compat/e2b/resolve/sitecustomize.py (the venv's resolver only)."""
    server = e2b_hosts_server
    python = session_venv(tmp_path_factory, CREWAI_TOOLS)
    address = server.url.removeprefix("https://")
    env = {
        "E2B_API_URL": f"{server.url}/e2b",
        "E2B_DOMAIN": DOMAIN,
        "E2B_API_KEY": server.create_key("crewai-hosts"),
        "SSL_CERT_FILE": str(server.data_dir.parent / "pki" / "ca.pem"),
        "PYTHONPATH": str(Path(__file__).with_name("resolve")),
        "SANDCELL_TEST_DOMAIN": DOMAIN,
        "SANDCELL_TEST_ADDRESS": address,
        "CREWAI_DISABLE_TELEMETRY": "true",
    }
    done = run_flow(python, "crewai_on_e2b_hosts", env, tmp_path_factory.mktemp("home"))
    assert done["python_tool"] == "ok", done["python_tool"]


@pytest.fixture(scope="module")
def agno() -> Iterator[E2BTools]:
    tools = E2BTools(sandbox_options={"template": "base"}, timeout=120)
    yield tools
    assert json.loads(tools.shutdown_sandbox())["status"] == "success"


def test_agno_code_and_commands(agno: E2BTools) -> None:
    ran = json.loads(agno.run_python_code("x = 6 * 7\nprint('hi')\nx"))
    assert ran[-1] == "Result 1: 42" and "hi" in ran[0], ran
    assert json.loads(agno.run_command("echo $((6 * 7))")) == ["STDOUT:\n42\n"]
    assert json.loads(agno.stream_command("echo out; echo err >&2")) == [
        "STDOUT: out\n",
        "STDERR: err\n",
    ]
    sleeper = agno.run_background_command("sleep 60")
    assert sleeper.pid in [p.pid for p in agno.sandbox.commands.list()]
    assert agno.kill_background_command(sleeper) == "Background command terminated successfully."


def test_agno_files(agno: E2BTools, tmp_path: Path) -> None:
    assert agno.write_file_content("/home/user/agno/a.txt", "from agno") == "/home/user/agno/a.txt"
    assert agno.read_file_content("/home/user/agno/a.txt") == "from agno"
    local = tmp_path / "up.txt"
    local.write_text("uploaded")
    assert agno.upload_file(str(local), "/home/user/agno/up.txt") == "/home/user/agno/up.txt"
    listing = agno.list_files("/home/user/agno")
    assert "- a.txt (File, 9 bytes)" in listing and "- up.txt (File, 8 bytes)" in listing
    # Not download_file_from_sandbox: it writes files.read's str to a file opened "wb",
    # which fails whatever the server.


def test_agno_list_files_of_the_root(agno: E2BTools) -> None:
    listing = agno.list_files()  # its default directory: the cell's root (test_cell_root.py)
    assert "Contents of /:" in listing and "\n- home (" in listing, listing


def test_agno_timeout(agno: E2BTools) -> None:
    assert agno.set_sandbox_timeout(200) == "200"
    left = (agno.sandbox.get_info().end_at - datetime.now(UTC)).total_seconds()
    assert 190 < left <= 201, left
