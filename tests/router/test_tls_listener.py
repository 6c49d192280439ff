"""`[server] tls_cert_file` / `tls_key_file`: the router's own listener over TLS. A real
`sandcell serve` answers HTTPS with the configured chain (and nothing in plain HTTP); files
that cannot serve, or a key other users could read, stop it from starting, named."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sandcell.manager.templates import ConfigError
from sandcell.settings import load_settings
from sdk.helpers import served
from support.server import SMALL_TEMPLATE, RunningServer
from support.tls_front import make_certificates

DOMAIN = "sandboxes.test"


def tls_config(cert: Path, key: Path, extra: str = "") -> str:
    head = f'[server]\ntls_cert_file = "{cert}"\ntls_key_file = "{key}"\n{extra}'
    return head + SMALL_TEMPLATE.format(warm_pool=0)


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, Path]]:
    root = tmp_path_factory.mktemp("tls-listener")
    ca, cert, key = make_certificates(DOMAIN, root / "pki")
    for srv in served(root, config_text=tls_config(cert, key), tls_ca=ca):
        yield srv, ca


@pytest.mark.slow
def test_the_listener_speaks_tls_with_its_chain(tls_server: tuple[RunningServer, Path]) -> None:
    srv, ca = tls_server
    assert srv.url.startswith("https://127.0.0.1:")
    with httpx.Client(verify=ssl.create_default_context(cafile=ca)) as https:
        assert https.get(f"{srv.url}/healthz").json()["status"] == "ok"
        key = srv.create_key("tls-user")
        made = https.post(
            f"{srv.url}/v1/sandboxes", json={}, headers={"authorization": f"Bearer {key}"}
        )
        assert made.status_code == 201, made.text
        sandbox = made.json()["id"]
        ran = https.post(
            f"{srv.url}/v1/sandboxes/{sandbox}/exec",
            json={"command": "echo over tls"},
            headers={"authorization": f"Bearer {key}"},
        )
        assert ran.json()["stdout"] == "over tls\n"
        https.delete(
            f"{srv.url}/v1/sandboxes/{sandbox}", headers={"authorization": f"Bearer {key}"}
        )
    plain = srv.url.replace("https://", "http://")
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{plain}/healthz", timeout=5).raise_for_status()
    with pytest.raises(httpx.ConnectError):  # a client that trusts another CA
        httpx.get(f"{srv.url}/healthz", timeout=5)


def _load(tmp_path: Path, text: str):
    config = tmp_path / "sandcell.toml"
    config.write_text(text)
    return load_settings(config, tmp_path / "data")


def test_the_files_are_taken_beside_the_config(tmp_path: Path) -> None:
    make_certificates(DOMAIN, tmp_path / "pki")
    settings = _load(tmp_path, tls_config(Path("pki/cert.pem"), Path("pki/key.pem")))
    assert settings.tls_files == (tmp_path / "pki" / "cert.pem", tmp_path / "pki" / "key.pem")


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ("mode", "readable by other users"),
        ("one", "go together"),
        ("garbage", "not a certificate chain and its key"),
        ("missing", "no such file"),
    ],
)
def test_files_that_cannot_serve_refuse_to_start(tmp_path: Path, change: str, named: str) -> None:
    _, cert, key = make_certificates(DOMAIN, tmp_path / "pki")
    text = tls_config(cert, key)
    if change == "mode":
        key.chmod(0o644)
    elif change == "one":
        text = f'[server]\ntls_cert_file = "{cert}"\n'
    elif change == "garbage":
        cert.write_text("not a certificate\n")
    elif change == "missing":
        cert.unlink()
    with pytest.raises(ConfigError, match=named):
        _load(tmp_path, text)
