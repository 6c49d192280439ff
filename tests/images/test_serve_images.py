"""Images through a real `sandcell serve`: states in GET /v1/templates, 409 until built, the
build through the CLI (progress and log), the SDK and the API, sandboxes on the image, and
deletion (refused while a sandbox uses the image)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from cells.conftest import cells_unsupported
from sandcell.client import ClientConfig, ConflictError, ForbiddenError, Sandbox
from sandcell.client.templates import BuildFailedError, Templates
from support import oci
from support.server import RunningServer, sandcell_bin, start_server

CONFIG = """
[templates.default]
memory_mb = 256
disk_mb = 128
warm_pool = 0

[templates.tiny]
memory_mb = 256
disk_mb = 128
warm_pool = 1
image.base = "oci-archive:busybox.tar"
image.files = { "/etc/motd" = "motd" }

[templates.broken]
warm_pool = 0
image.base = "oci-archive:busybox.tar"
image.run = ["echo about to fail", "exit 7"]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    if why := cells_unsupported():
        pytest.skip(why)
    root = tmp_path_factory.mktemp("serve-images")
    env = ["GREETING=hi", "PYTHONPATH=/evil", "LD_PRELOAD=/evil.so", "SANDCELL_SANDBOX_ID=x"]
    oci.write_archive(root / "busybox.tar", [oci.busybox_rootfs()], env=env)
    (root / "motd").write_text("hello from the image\n")
    server = start_server(root / "data", config_text=CONFIG)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def admin(server: RunningServer) -> ClientConfig:
    return ClientConfig(url=server.url, api_key=server.create_key("ops", admin=True))


@pytest.fixture(scope="module")
def user(server: RunningServer) -> ClientConfig:
    return ClientConfig(url=server.url, api_key=server.create_key("alice"))


def _states(config: ClientConfig) -> dict[str, str]:
    return {t["name"]: t["image"]["state"] for t in Templates.list(config=config)}


def _cli(server: RunningServer, key: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SANDCELL_URL": server.url, "SANDCELL_API_KEY": key}
    return subprocess.run(
        [sandcell_bin(), "template", *args], capture_output=True, text=True, env=env, timeout=120
    )


@pytest.mark.slow
def test_an_image_template_is_409_until_built_then_runs_on_its_image(
    server: RunningServer, admin: ClientConfig, user: ClientConfig
) -> None:
    states = _states(user)
    assert states["default"] == "ready" and states["tiny"] == "absent"
    assert states["code-interpreter"] == "absent"  # listing never starts a build
    with pytest.raises(ConflictError) as refused:
        Sandbox.create("tiny", config=user)
    assert refused.value.code == "TEMPLATE_NOT_READY"
    assert refused.value.details["image"]["state"] in ("building", "ready")

    built = _cli(server, admin.api_key or "", "build", "tiny")  # follows the build under way
    assert built.returncode == 0, built.stderr
    assert "tiny: ready" in built.stdout
    listing = json.loads(_cli(server, admin.api_key or "", "ls", "--json").stdout)
    assert {t["name"]: t["image"]["state"] for t in listing}["tiny"] == "ready"

    with Sandbox.create("tiny", config=user) as sbx:
        r = sbx.commands.run("cat /etc/os-release /etc/motd")
        assert r.stdout == oci.OS_RELEASE.decode() + "hello from the image\n"
        # The image's Env reaches commands, except what would steer the daemon itself.
        r = sbx.commands.run("echo $GREETING $PYTHONPATH $LD_PRELOAD $SANDCELL_SANDBOX_ID")
        assert r.stdout == "hi\n", r
        with pytest.raises(ConflictError):  # a live sandbox runs on it
            Templates.remove("tiny", config=admin)
    assert Templates.remove("tiny", config=admin) is True
    assert _states(user)["tiny"] == "absent"


def test_a_second_build_is_a_no_op_with_the_same_digest(admin: ClientConfig) -> None:
    events: list[dict] = []
    first = Templates.build("tiny", config=admin)
    again = Templates.build("tiny", on_event=events.append, config=admin)
    assert again["digest"] == first["digest"] and again["built_at"] == first["built_at"]
    assert events == []


def test_building_needs_an_admin_key_and_an_image_template(
    admin: ClientConfig, user: ClientConfig
) -> None:
    with pytest.raises(ForbiddenError):
        Templates.build("tiny", config=user)
    for name in ("default", "nope"):
        with pytest.raises(Exception) as refused:
            Templates.build(name, config=admin)
        assert getattr(refused.value, "status", None) == 400


def test_a_failing_step_is_reported_with_its_log(
    server: RunningServer, admin: ClientConfig, user: ClientConfig
) -> None:
    with pytest.raises(BuildFailedError) as failed:
        Templates.build("broken", config=admin)
    assert failed.value.details["step"] == "run 2"
    cli = _cli(server, admin.api_key or "", "build", "broken")
    assert cli.returncode == 1
    assert "BUILD_FAILED" in cli.stderr and "run 2" in cli.stderr
    with pytest.raises(ConflictError) as refused:
        Sandbox.create("broken", config=user)
    assert refused.value.details["image"]["state"] == "failed"
    assert refused.value.details["image"]["error"]["step"] == "run 2"


def test_nothing_half_made_is_left(server: RunningServer) -> None:
    images = Path(server.data_dir) / "images"
    assert [p.name for p in (images / "tmp").iterdir()] == []
