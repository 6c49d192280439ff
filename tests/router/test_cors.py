"""`[server] cors_origins`: browser pages of the listed origins may call sandcell (E2B's JS SDK
sends `X-API-KEY`, `X-Access-Token`, `E2b-Sandbox-*` and Connect's headers); any other origin
gets no CORS grant, and the setting refuses what it cannot mean."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sandcell.manager.templates import ConfigError
from sandcell.settings import load_settings
from sdk.helpers import stop_and_clean
from support.server import SMALL_TEMPLATE, RunningServer, start_server

APP = "http://app.example.test:3000"
E2B_HEADERS = "x-api-key,x-access-token,e2b-sandbox-id,connect-protocol-version,content-type"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    config = f'[server]\ncors_origins = ["{APP}"]\n' + SMALL_TEMPLATE.format(warm_pool=0)
    running = start_server(tmp_path_factory.mktemp("cors") / "data", config_text=config)
    try:
        yield running
    finally:
        stop_and_clean(running)


def _preflight(server: RunningServer, origin: str, path: str) -> httpx.Response:
    return httpx.options(
        f"{server.url}{path}",
        headers={
            "Origin": origin,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": E2B_HEADERS,
        },
    )


@pytest.mark.parametrize("path", ["/e2b/sandboxes", "/e2b/process.Process/Start", "/v1/sandboxes"])
def test_listed_origin_may_send_e2b_headers(server: RunningServer, path: str) -> None:
    answer = _preflight(server, APP, path)
    assert answer.status_code == 200
    assert answer.headers["access-control-allow-origin"] == APP
    allowed = {h.strip().lower() for h in answer.headers["access-control-allow-headers"].split(",")}
    assert set(E2B_HEADERS.split(",")) <= allowed
    assert "POST" in answer.headers["access-control-allow-methods"]
    # No credentials mode: keys travel in headers, never in cookies a page could ride on.
    assert "access-control-allow-credentials" not in answer.headers


def test_listed_origin_reads_answers_and_the_pagination_header(server: RunningServer) -> None:
    key = server.create_key("cors-user")
    answer = httpx.get(f"{server.url}/e2b/v2/sandboxes", headers={"Origin": APP, "X-API-KEY": key})
    assert answer.status_code == 200
    assert answer.headers["access-control-allow-origin"] == APP
    assert "x-next-token" in answer.headers["access-control-expose-headers"].lower()


@pytest.mark.parametrize("origin", ["http://evil.example.test", APP + ".evil.test", "null"])
def test_other_origins_get_no_grant(server: RunningServer, origin: str) -> None:
    answer = _preflight(server, origin, "/e2b/sandboxes")
    assert answer.status_code == 400
    assert "access-control-allow-origin" not in answer.headers
    plain = httpx.get(f"{server.url}/healthz", headers={"Origin": origin})
    assert "access-control-allow-origin" not in plain.headers


def test_without_the_setting_no_origin_is_granted(tmp_path: Path) -> None:
    assert load_settings(None, tmp_path).cors_origins == ()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ('["*"]', "'*' is refused"),
        ('["https://app.example.com/"]', "is not an origin"),
        ('["app.example.com"]', "is not an origin"),
        ('"https://app.example.com"', "must be a list"),
        ("[1]", "must be a list"),
    ],
)
def test_refused_values_name_the_setting(tmp_path: Path, value: str, message: str) -> None:
    config = tmp_path / "sandcell.toml"
    config.write_text(f"[server]\ncors_origins = {value}\n")
    with pytest.raises(ConfigError, match=r"cors_origins") as raised:
        load_settings(config, tmp_path / "data")
    assert message in str(raised.value)
