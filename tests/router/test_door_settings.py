"""The door's limits in `[server]`: defaults, overrides and refused values."""

from __future__ import annotations

import resource

import pytest

from sandcell.http.limits import MIN_FD_RESERVE, ConnectionLimits
from sandcell.manager.templates import ConfigError
from sandcell.settings import load_settings


def _settings(tmp_path, text: str):
    config = tmp_path / "sandcell.toml"
    config.write_text(text)
    return load_settings(config, tmp_path / "data")


def test_defaults_and_overrides(tmp_path):
    default = _settings(tmp_path, "")
    assert default.connections == ConnectionLimits()
    assert default.body_budget_per_key_bytes < default.body_budget_bytes
    custom = _settings(
        tmp_path,
        "[server]\nheader_timeout_s = 2\nmax_header_bytes = 8192\nbody_timeout_s = 1.5\n"
        "min_body_rate = 1000\nmax_connections = 50\nmax_inflight_per_key = 3\n"
        "body_budget_bytes = 4194304\nbody_budget_per_key_bytes = 1048576\n",
    )
    assert custom.connections == ConnectionLimits(2.0, 8192, 1.5, 1000, 50)
    assert custom.max_inflight_per_key == 3
    assert (custom.body_budget_bytes, custom.body_budget_per_key_bytes) == (4 * 2**20, 2**20)


@pytest.mark.parametrize(
    "line",
    [
        "header_timeout_s = 0",
        "header_timeout_s = true",
        "body_timeout_s = 99999",
        "max_header_bytes = 10",
        "min_body_rate = 0",
        "max_connections = -1",
        "body_budget_bytes = 10",
    ],
)
def test_bad_values_are_refused(tmp_path, line):
    with pytest.raises(ConfigError):
        _settings(tmp_path, f"[server]\n{line}\n")


def test_the_connection_cap_stays_below_the_file_limit():
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    auto = ConnectionLimits().connection_cap()
    assert auto <= soft - MIN_FD_RESERVE or auto == 16
    assert ConnectionLimits(max_connections=10**6).connection_cap() == auto
    assert ConnectionLimits(max_connections=50).connection_cap() == min(50, auto)
