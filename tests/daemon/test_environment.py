"""The env allow-list (SPEC §2.3): no host secret reaches a command, whatever the request."""

from __future__ import annotations

import pytest

from sandcell.cellapi.client import DaemonClient
from sandcell.cellapi.environment import FIXED_PATH, build_env
from support.daemons import ALLOWED_FROM_HOST, HOST_SECRETS, RunningDaemon


def _env_of(client: DaemonClient, **fields) -> dict[str, str]:
    r = client.exec(["/usr/bin/env", "-0"], **fields)
    assert r["exit_code"] == 0
    return dict(item.split("=", 1) for item in r["stdout"].split("\0") if item)


@pytest.mark.parametrize("env_field", ["omitted", None, {}, {"MINE": "1"}])
def test_no_host_secret_reaches_a_command(client: DaemonClient, daemon: RunningDaemon, env_field):
    fields = {} if env_field == "omitted" else {"env": env_field}
    env = _env_of(client, **fields)
    for name, value in HOST_SECRETS.items():
        assert name not in env
        assert value not in "".join(env.values())
    assert not [n for n in env if n.startswith("SANDCELL_")]
    assert env["PATH"] == FIXED_PATH
    assert env["HOME"] == str(daemon.workspace)
    for name, value in ALLOWED_FROM_HOST.items():
        assert env[name] == value
    expected = {"PATH", "HOME", *ALLOWED_FROM_HOST, "SANDBOX_DEFAULT", "OVERRIDE_ME"}
    if isinstance(env_field, dict):
        expected |= set(env_field)
    assert set(env) == expected


def test_secret_invisible_to_shell_expansion(client: DaemonClient):
    r = client.exec('echo "[$AWS_SECRET_ACCESS_KEY][$SANDCELL_STORE_KEY]"')
    assert r["stdout"] == "[][]\n"


def test_merge_order_and_empty_values(client: DaemonClient):
    env = _env_of(client, env={"OVERRIDE_ME": "request", "EMPTY": "", "PATH": "/custom"})
    assert env["SANDBOX_DEFAULT"] == "from-template"
    assert env["OVERRIDE_ME"] == "request"
    assert env["EMPTY"] == ""
    assert env["PATH"] == "/custom"


def test_request_env_does_not_leak_into_next_command(client: DaemonClient):
    _env_of(client, env={"ONE_SHOT": "x"})
    assert "ONE_SHOT" not in _env_of(client)


@pytest.mark.parametrize("env", [{"": "x"}, {"A=B": "x"}, {"A\0B": "x"}, {"OK": "bad\0value"}])
def test_bad_names_and_values_rejected(client: DaemonClient, env):
    r = client.signed_request("POST", "/v1/exec", json_body={"command": "true", "env": env})
    assert r.status_code == 400 and r.json()["error"]["code"] == "BAD_REQUEST"


def test_build_env_never_touches_its_source():
    source = {"LANG": "C", "SECRET": "s"}
    env = build_env(
        workspace="/w",
        inherit=["LANG", "SECRET_NOT_LISTED"],
        source=source,
        defaults={},
        request={"X": "1"},
    )
    assert env == {"PATH": FIXED_PATH, "HOME": "/w", "LANG": "C", "X": "1"}
    assert source == {"LANG": "C", "SECRET": "s"}


def test_template_allow_list_replaces_default(tmp_path):
    from support.daemons import launch_daemon

    d = launch_daemon(tmp_path, "--inherit-env", "TZ")
    try:
        d.initialize()
        with d.client() as c:
            env = _env_of(c)
        assert env == {"PATH": FIXED_PATH, "HOME": str(d.workspace), "TZ": "Europe/Paris"}
    finally:
        d.stop()
