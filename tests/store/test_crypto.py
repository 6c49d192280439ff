"""Store key loading, sealing, and API key helpers."""

from __future__ import annotations

import base64
import os
import stat
import threading
from pathlib import Path

import pytest

from sandcell.store import Sealer, StoreCryptoError, hash_api_key, load_store_key, new_api_key


@pytest.fixture(autouse=True)
def _no_key_in_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SANDCELL_STORE_KEY", raising=False)


def test_seal_round_trip_with_fresh_nonce() -> None:
    sealer = Sealer(os.urandom(32))
    a, b = sealer.seal(b"pem", b"sbx-1"), sealer.seal(b"pem", b"sbx-1")
    assert a != b
    assert a[0] == 1  # version byte
    assert sealer.open(a, b"sbx-1") == sealer.open(b, b"sbx-1") == b"pem"


def test_open_refuses_anything_but_the_sealed_value() -> None:
    sealer = Sealer(os.urandom(32))
    blob = sealer.seal(b"secret", b"sbx-1")
    cases = {
        "wrong aad": (blob, b"sbx-2"),
        "flipped bit": (blob[:-1] + bytes([blob[-1] ^ 1]), b"sbx-1"),
        "truncated": (blob[:10], b"sbx-1"),
        "unknown version": (b"\x02" + blob[1:], b"sbx-1"),
    }
    for damaged, aad in cases.values():
        with pytest.raises(StoreCryptoError):
            sealer.open(damaged, aad)


def test_wrong_key_is_refused() -> None:
    blob = Sealer(os.urandom(32)).seal(b"secret", b"a")
    with pytest.raises(StoreCryptoError, match="wrong store key"):
        Sealer(os.urandom(32)).open(blob, b"a")
    with pytest.raises(StoreCryptoError):
        Sealer(b"short")


def test_key_from_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    key = os.urandom(32)
    monkeypatch.setenv("SANDCELL_STORE_KEY", base64.b64encode(key).decode() + "\n")
    assert load_store_key(tmp_path) == key
    assert not (tmp_path / "store.key").exists()  # the env wins; no file is made


@pytest.mark.parametrize(
    "value",
    [
        "",
        "not base64!",
        base64.b64encode(os.urandom(16)).decode(),
        base64.b64encode(os.urandom(33)).decode(),
    ],
    ids=["empty", "garbage", "16-bytes", "33-bytes"],
)
def test_bad_env_key_is_rejected(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, value: str
) -> None:
    monkeypatch.setenv("SANDCELL_STORE_KEY", value)
    with pytest.raises(StoreCryptoError, match="SANDCELL_STORE_KEY must be the base64"):
        load_store_key(tmp_path)


def test_key_file_created_0600_and_reused(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    old_umask = os.umask(0)  # the mode must not depend on a friendly umask
    try:
        key = load_store_key(data_dir)
    finally:
        os.umask(old_umask)
    path = data_dir / "store.key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(key) == 32
    assert load_store_key(data_dir) == key
    assert [p.name for p in data_dir.iterdir()] == ["store.key"]  # no temp file left behind


def test_key_file_race_yields_one_key(tmp_path: Path) -> None:
    keys: list[bytes] = []
    barrier = threading.Barrier(8)

    def start() -> None:
        barrier.wait()
        keys.append(load_store_key(tmp_path))

    threads = [threading.Thread(target=start) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(keys) == 8
    assert len(set(keys)) == 1


def test_key_file_open_to_others_is_refused(tmp_path: Path) -> None:
    load_store_key(tmp_path)
    (tmp_path / "store.key").chmod(0o640)
    with pytest.raises(StoreCryptoError, match="accessible by group or others"):
        load_store_key(tmp_path)


def test_corrupt_key_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "store.key"
    path.write_text("too short\n")
    path.chmod(0o600)
    with pytest.raises(StoreCryptoError, match="store key file"):
        load_store_key(tmp_path)


def test_api_key_helpers() -> None:
    key = new_api_key()
    assert key.startswith("sc_")
    assert len(key) == 3 + 43
    assert new_api_key() != key
    assert hash_api_key(key) == hash_api_key(key)
    assert len(hash_api_key(key)) == 64
    assert hash_api_key(key) != hash_api_key(new_api_key())
