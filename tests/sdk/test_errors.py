"""Every error type a real server can be made to return, raised as its typed exception."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from sandcell.client import (
    AuthenticationError,
    BadRequestError,
    ClientConfig,
    ConflictError,
    ConnectionFailedError,
    FileNotFoundInSandboxError,
    ForbiddenError,
    PayloadTooLargeError,
    RetryPolicy,
    SandboxNotFoundError,
    SandboxUnreachableError,
    SandcellError,
)
from sdk.helpers import Flavour, kill_daemon
from support.server import RunningServer, free_port

pytestmark = pytest.mark.anyio


async def test_bad_request(flavour: Flavour, config: ClientConfig, shared_sandbox: str):
    with pytest.raises(BadRequestError) as info:
        await flavour(flavour.cls.create(template="no-such-template", config=config))
    assert (info.value.code, info.value.status) == ("BAD_REQUEST", 400)
    assert "no-such-template" in info.value.message
    async with flavour.connected(shared_sandbox, config) as sbx:
        with pytest.raises(BadRequestError) as info:
            await flavour(sbx.commands.run("true", timeout=0))
        assert info.value.details["errors"][0]["loc"] == ["timeout_s"]
        with pytest.raises(BadRequestError):
            await flavour(sbx.commands.run("true", env={"A=B": "1"}))


async def test_authentication(flavour: Flavour, sdk_server: RunningServer):
    with pytest.raises(AuthenticationError) as info:
        await flavour(flavour.cls.list(url=sdk_server.url, api_key="sc_not_a_key"))
    assert (info.value.code, info.value.status) == ("UNAUTHENTICATED", 401)


async def test_not_found(flavour: Flavour, config: ClientConfig, shared_sandbox: str):
    with pytest.raises(SandboxNotFoundError) as info:
        await flavour(flavour.cls.connect("sbx-0000000000000000", config=config))
    assert (info.value.code, info.value.status) == ("SANDBOX_NOT_FOUND", 404)
    with pytest.raises(SandboxNotFoundError):  # not even a valid id: never sent
        await flavour(flavour.cls.connect("../v1/templates", config=config))
    async with flavour.connected(shared_sandbox, config) as sbx:
        with pytest.raises(FileNotFoundInSandboxError) as finfo:
            await flavour(sbx.files.read("no/such/file"))
        assert finfo.value.code == "FILE_NOT_FOUND" and finfo.value.details["path"]
        with pytest.raises(FileNotFoundInSandboxError):
            await flavour(sbx.commands.run("true", cwd="no/such/dir"))


@pytest.fixture(scope="module")
def stranger(sdk_server: RunningServer) -> ClientConfig:
    return ClientConfig(url=sdk_server.url, api_key=sdk_server.create_key("stranger"))


async def test_another_principals_sandbox_is_not_found(
    flavour: Flavour, stranger: ClientConfig, shared_sandbox: str
):
    with pytest.raises(SandboxNotFoundError):
        await flavour(flavour.cls.connect(shared_sandbox, config=stranger))
    assert shared_sandbox not in [s.id for s in await flavour(flavour.cls.list(config=stranger))]


async def test_forbidden_and_conflict(flavour: Flavour, config: ClientConfig, shared_sandbox: str):
    async with flavour.connected(shared_sandbox, config) as sbx:
        for path in ("../etc/passwd", "/etc/passwd"):
            with pytest.raises(ForbiddenError) as info:
                await flavour(sbx.files.read(path))
            assert (info.value.code, info.value.status) == ("FORBIDDEN", 403)
        await flavour(sbx.commands.run("ln -sf /etc conflict-link"))
        with pytest.raises(ForbiddenError):
            await flavour(sbx.files.write("conflict-link/x", b"escape"))
        await flavour(sbx.files.write(f"c-{flavour.name}/a", b"a"))
        await flavour(sbx.files.write(f"c-{flavour.name}/b", b"b"))
        with pytest.raises(ConflictError) as cinfo:
            await flavour(sbx.files.move(f"c-{flavour.name}/a", f"c-{flavour.name}/b"))
        assert (cinfo.value.code, cinfo.value.status) == ("CONFLICT", 409)


@pytest.fixture(scope="module")
def over_quota_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """129 MB, past the test template's 128 MB disk quota (sparse: costs no disk here)."""
    path = tmp_path_factory.mktemp("quota") / "129mb.bin"
    with path.open("wb") as f:
        f.truncate(129 * 1_048_576)
    return path


async def test_payload_too_large(
    flavour: Flavour, config: ClientConfig, shared_sandbox: str, over_quota_file: Path
):
    async with flavour.connected(shared_sandbox, config) as sbx:
        with pytest.raises(PayloadTooLargeError) as info:
            await flavour(sbx.files.upload(over_quota_file, "too-big.bin"))
        assert (info.value.code, info.value.status) == ("PAYLOAD_TOO_LARGE", 413)
        assert info.value.details["limit_bytes"] == 128 * 1_048_576
        assert not await flavour(sbx.files.exists("too-big.bin"))


async def test_sandbox_unreachable_when_its_daemon_died(flavour: Flavour, config: ClientConfig):
    async with flavour.sandbox(config) as sbx:
        kill_daemon(sbx.id)
        with pytest.raises(SandboxUnreachableError) as info:
            await flavour(sbx.commands.run("true"))
        assert (info.value.code, info.value.status) == ("SANDBOX_UNREACHABLE", 502)
        assert info.value.details == {"sandbox_id": sbx.id}


async def test_connection_failed_after_retrying(flavour: Flavour):
    quick = ClientConfig(
        url=f"http://127.0.0.1:{free_port()}",  # nothing listens there
        api_key="sc_x",
        retry=RetryPolicy(max_retries=2, backoff_s=0.1),
    )
    started = time.monotonic()
    with pytest.raises(ConnectionFailedError) as info:
        await flavour(flavour.cls.create(config=quick))
    assert info.value.request_sent is False and info.value.status is None
    assert time.monotonic() - started >= 0.05 + 0.1  # two backoffs: it did retry
    assert isinstance(info.value, SandcellError) and "cannot connect" in str(info.value)
