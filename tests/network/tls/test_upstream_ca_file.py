"""`[server] upstream_ca_file`: a server that could not verify its upstreams does not start."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from network.tls.conftest import UpstreamCA
from sandcell.manager.templates import ConfigError
from sandcell.settings import load_settings


def settings_with(tmp_path: Path, value: str):
    config = tmp_path / "sandcell.toml"
    config.write_text(f'[server]\nupstream_ca_file = "{value}"\n')
    return load_settings(config, tmp_path / "data")


def test_a_pem_file_of_cas_is_taken_relative_to_the_config(tmp_path):
    (tmp_path / "cas.pem").write_bytes(UpstreamCA.make().pem())
    assert settings_with(tmp_path, "cas.pem").upstream_ca_file == tmp_path / "cas.pem"


@pytest.mark.parametrize(
    ("content", "said"), [(None, "cannot be read"), (b"not a certificate\n", "not PEM")]
)
def test_a_missing_or_malformed_file_is_refused_by_name(tmp_path, content, said):
    if content is not None:
        (tmp_path / "cas.pem").write_bytes(content)
    with pytest.raises(ConfigError, match=f"upstream_ca_file .*cas.pem.* {said}"):
        settings_with(tmp_path, "cas.pem")


def test_serve_refuses_to_start_naming_it(tmp_path):
    config = tmp_path / "sandcell.toml"
    config.write_text('[server]\nupstream_ca_file = "/nonexistent/cas.pem"\n')
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "sandcell"), "serve", "--config", str(config),
         "--data-dir", str(tmp_path / "data")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "upstream_ca_file '/nonexistent/cas.pem' cannot be read" in proc.stderr
