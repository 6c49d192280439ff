"""`sandcell template ls` as a script reads it: through a pipe, every column and every row
whole, whatever the width a terminal would have had."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from sdk.helpers import stop_and_clean
from support.server import SMALL_TEMPLATE, RunningServer, sandcell_bin, start_server

pytestmark = pytest.mark.slow  # a server of its own

# A base long enough that the row is wider than the 80 columns rich assumes off a terminal.
LONG_BASE = "oci-archive:images/python-3.12-slim-bookworm-with-the-scientific-stack.tar"
CONFIG = (
    SMALL_TEMPLATE.format(warm_pool=0) + f'\n[templates.archived]\nimage.base = "{LONG_BASE}"\n'
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    server = start_server(tmp_path_factory.mktemp("templates") / "data", config_text=CONFIG)
    try:
        yield server
    finally:
        stop_and_clean(server)


def template_ls(server: RunningServer, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(Path(server.data_dir).parent),
        "SANDCELL_URL": server.url,
        "SANDCELL_API_KEY": server.create_key(f"ls-{len(args)}"),
    }  # no COLUMNS: what a pipe in a script gets
    return subprocess.run(
        [sandcell_bin(), "template", "ls", *args],
        env=env,
        capture_output=True,  # stdout is a pipe, not a terminal
        text=True,
        timeout=60,
    )


def test_template_ls_through_a_pipe_keeps_every_column(server: RunningServer):
    listed = template_ls(server)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split() == ["NAME", "BASE", "STATE", "DIGEST", "SIZE", "BUILT"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert len(max(lines, key=len)) > 80  # the row that rich squeezed into 80 columns

    templates = json.loads(template_ls(server, "--json").stdout)
    assert (
        {t["name"] for t in templates} == set(rows) == {"default", "archived", "code-interpreter"}
    )
    for t in templates:
        image = t["image"]
        _, base, state, digest, *_ = rows[t["name"]]
        assert (base, state) == (image["base"], image["state"])
        assert digest == (image["digest"] or "-")[:12]
    assert rows["archived"][1:3] == [LONG_BASE, "absent"]
    assert rows["default"][1:3] == ["host", "ready"]
