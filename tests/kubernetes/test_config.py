"""The `[kubernetes]` table and the backend choice in the server's config file."""

from __future__ import annotations

import re

import pytest

from sandcell.manager.templates import ConfigError
from sandcell.settings import load_settings


def settings(tmp_path, text: str):
    path = tmp_path / "sandcell.toml"
    path.write_text(text)
    return load_settings(path, tmp_path)


def test_defaults_and_manager_name_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("SANDCELL_MANAGER_ID", "sandcell-3")
    loaded = settings(tmp_path, "")
    assert loaded.backend == "local"
    assert loaded.kubernetes.namespace == "sandcell-sandboxes"
    assert loaded.kubernetes.manager_id == "sandcell-3"
    assert loaded.kubernetes.runtime_class is None


def test_a_kubernetes_table(tmp_path):
    loaded = settings(
        tmp_path,
        '[server]\nbackend = "kubernetes"\n'
        '[kubernetes]\nnamespace = "sbx"\nruntime_class = "gvisor"\ndaemon_port = 9000\n',
    )
    assert loaded.backend == "kubernetes"
    assert (loaded.kubernetes.namespace, loaded.kubernetes.daemon_port) == ("sbx", 9000)


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ('[server]\nbackend = "docker"\n', "backend must be one of"),
        ("[kubernetes]\nnamespce = 'x'\n", "namespce"),
        ("[kubernetes]\nnamespace = 'Not_DNS'\n", "namespace"),
        ("[kubernetes]\ndaemon_port = 0\n", "daemon_port"),
        ("[kubernetes]\napi_server = 'ftp://x'\n", "api_server"),
        ("kubernetes = 1\n", "[kubernetes] must be a table"),
    ],
)
def test_mistakes_are_named(tmp_path, text, complaint):
    with pytest.raises(ConfigError, match=re.escape(complaint)):
        settings(tmp_path, text)
