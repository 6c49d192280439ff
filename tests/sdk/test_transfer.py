"""Uploads and downloads stream a ~20 MB file in chunks, with progress, both clients."""

from __future__ import annotations

import hashlib
import os
import tracemalloc
from pathlib import Path

import pytest

from sandcell.client import ClientConfig
from sdk.helpers import Flavour

pytestmark = pytest.mark.anyio
SIZE = 20 * 1_048_576 + 123


@pytest.fixture(scope="module")
def big_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("transfer") / "big.bin"
    with path.open("wb") as f:
        for _ in range(SIZE // 1_048_576):
            f.write(os.urandom(1_048_576))
        f.write(os.urandom(SIZE % 1_048_576))
    return path


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


async def test_upload_and_download_stream_with_progress(
    flavour: Flavour, config: ClientConfig, shared_sandbox: str, big_file: Path, tmp_path: Path
):
    up: list[tuple[int, int | None]] = []
    down: list[tuple[int, int | None]] = []
    remote = f"transfer/{flavour.name}/big.bin"
    async with flavour.connected(shared_sandbox, config) as sbx:
        tracemalloc.start()
        try:
            entry = await flavour(
                sbx.files.upload(big_file, remote, progress=lambda d, t: up.append((d, t)))
            )
            target = await flavour(
                sbx.files.download(remote, tmp_path, progress=lambda d, t: down.append((d, t)))
            )
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        r = await flavour(sbx.commands.run(["sha256sum", remote]))
        await flavour(sbx.files.remove(f"transfer/{flavour.name}", recursive=True))

    assert entry.size == SIZE and entry.path == remote
    assert r.stdout.split()[0] == _sha256(big_file)  # what arrived in the sandbox
    assert target == tmp_path / "big.bin" and _sha256(target) == _sha256(big_file)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".part")]
    # Never whole in memory: chunks, not one 20 MB buffer.
    assert peak < SIZE / 4, f"peak Python allocation {peak} bytes"
    for calls in (up, down):
        assert len(calls) >= 10, calls[:3]
        dones = [d for d, _ in calls]
        assert dones == sorted(dones) and dones[-1] == SIZE
        assert {t for _, t in calls} == {SIZE}


async def test_a_failed_download_leaves_no_partial_file(
    flavour: Flavour, config: ClientConfig, shared_sandbox: str, tmp_path: Path
):
    from sandcell.client import FileNotFoundInSandboxError

    async with flavour.connected(shared_sandbox, config) as sbx:
        with pytest.raises(FileNotFoundInSandboxError):
            await flavour(sbx.files.download("no/such/file", tmp_path / "out.bin"))
    assert list(tmp_path.iterdir()) == []
