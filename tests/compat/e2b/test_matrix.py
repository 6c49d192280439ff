"""docs/e2b.md's version matrix: one scripted flow (matrix_flow.py, node/flow.mjs) run by each
listed release of the E2B packages, unmodified, against this package's `sandcell serve`.

Python rows other than the test venv's own run in session venvs (venvs.py), one per row; the
npm rows run from node/package-lock.json, installed by `npm ci` into the session's tmp."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from compat.e2b.venvs import hex_key, run_python, session_venv
from sdk.helpers import stop_and_clean
from support.server import SMALL_TEMPLATE, start_server
from support.tls_front import tls_front

pytestmark = pytest.mark.slow
HERE = Path(__file__).parent
FLOW = HERE / "matrix_flow.py"
NODE_FILES = ("package.json", "package-lock.json", "flow.mjs")
DOMAIN = "matrix.test"


@dataclass(frozen=True)
class Row:
    package: str
    version: str
    # What the row's venv holds: nothing for the versions pinned in the test venv.
    requirements: tuple[str, ...] = ()
    # e2b 2.2x-2.4x refuse an API key not of the form e2b_<hex> before sending it: "native"
    # gives the row a key made with `keys create --e2b`, "hex" an sc_ key hex-encoded.
    key: str = "sc"
    # e2b-code-interpreter <= 2.6 reaches its interpreter at https://49999-{id}.{domain}
    # whatever E2B_SANDBOX_URL says: its code flow needs the per-sandbox hosts.
    code_by_host: bool = False

    @property
    def module(self) -> str:
        return self.package.replace("-", "_")


ROWS = [
    Row("e2b", "2.7.0", ("e2b==2.7.0",)),
    Row("e2b", "2.20.3", ("e2b==2.20.3",)),  # crewai-tools' pin
    Row("e2b", "2.31.0", ("e2b==2.31.0",), key="native"),  # openai-agents' pin
    Row("e2b", "2.45.1", ("e2b==2.45.1",), key="hex"),
    Row("e2b", "2.63.0"),
    # With e2b 2.20.3, its lowest e2b and crewai-tools' pair.
    Row(
        "e2b-code-interpreter",
        "2.6.2",
        ("e2b-code-interpreter==2.6.2", "e2b==2.20.3"),
        code_by_host=True,
    ),
    Row("e2b-code-interpreter", "2.11.5"),
]
CASES = [
    pytest.param(row, flow, id=f"{row.package}=={row.version}-{flow}")
    for row in ROWS
    for flow in (["sandbox", "code"] if row.package == "e2b-code-interpreter" else ["sandbox"])
]


@pytest.fixture(scope="module")
def by_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The E2B variables of a server with `server.preview_domain` set, behind a TLS front
    for `*.{DOMAIN}` (tests/support/tls_front.py) that stands in for an operator's wildcard
    DNS and certificate: no E2B_SANDBOX_URL, every sandbox call by its host."""
    base = tmp_path_factory.mktemp("matrix-hosts")
    config = f'[server]\npreview_domain = "{DOMAIN}"\n' + SMALL_TEMPLATE.format(warm_pool=0)
    server = start_server(base / "data", config_text=config)
    try:
        with tls_front(DOMAIN, server.url, base) as front:
            yield {
                "E2B_API_URL": f"{server.url}/e2b",
                "E2B_API_KEY": server.create_key("matrix"),
                "E2B_DOMAIN": DOMAIN,
                "SSL_CERT_FILE": str(front.ca),
                "MATRIX_PROXY": front.url,
            }
    finally:
        stop_and_clean(server)


@pytest.mark.timeout(900)
@pytest.mark.parametrize(("row", "flow"), CASES)
def test_python_sdk(
    row: Row,
    flow: str,
    tmp_path_factory: pytest.TempPathFactory,
    e2b_env: dict[str, str],
    request: pytest.FixtureRequest,
) -> None:
    python = session_venv(tmp_path_factory, row.requirements) if row.requirements else None
    if row.code_by_host and flow == "code":
        env = request.getfixturevalue("by_host")
    elif row.key == "native":
        env = request.getfixturevalue("e2b_native_env")
    else:
        env = hex_key(e2b_env) if row.key == "hex" else e2b_env
    done = run_python(python or Path(sys.executable), [FLOW, flow, row.module], env)
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.startswith("ok"), done.stdout


@pytest.fixture(scope="module")
def node_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """node/ copied to the session's tmp and installed there from its lockfile."""
    npm = shutil.which("npm")
    assert npm and shutil.which("node"), "node and npm come from scripts/setup.sh"
    where = tmp_path_factory.mktemp("node-matrix")
    for name in NODE_FILES:
        shutil.copy(HERE / "node" / name, where / name)
    subprocess.run(
        [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
        cwd=where,
        check=True,
        timeout=600,
    )
    return where


# The npm rows: each package at the version node/package.json pins, and the flow it runs.
NPM = json.loads((HERE / "node" / "package.json").read_text())["dependencies"]
NPM_ROWS = [("e2b", "sandbox"), ("@e2b/code-interpreter", "code")]


@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    "flow", [pytest.param(flow, id=f"{name}@{NPM[name]}-{flow}") for name, flow in NPM_ROWS]
)
def test_node_sdk(flow: str, node_dir: Path, e2b_env: dict[str, str]) -> None:
    done = subprocess.run(
        ["node", "flow.mjs", flow],
        cwd=node_dir,
        env={**os.environ, **e2b_env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.startswith("ok"), done.stdout


def test_the_docs_matrix_names_every_row() -> None:
    """docs/e2b.md's table names each row's test, at the version the row installs."""
    table = (HERE.parents[2] / "docs" / "e2b.md").read_text()
    for row in ROWS:
        assert f"test_python_sdk[{row.package}=={row.version}-sandbox]" in table, row
    for name, flow in NPM_ROWS:
        assert f"test_node_sdk[{name}@{NPM[name]}-{flow}]" in table, name
