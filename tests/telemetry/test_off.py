"""Telemetry off (no `[telemetry] otlp_endpoint`): a real server imports nothing of
OpenTelemetry, however it is called; and the setting itself is checked by name."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from sandcell.manager.templates import ConfigError
from sandcell.settings import load_settings
from sdk.helpers import stop_and_clean
from support.server import SMALL_TEMPLATE, RunningServer, free_port

from .recording import TRACEPARENT

# `sandcell serve` as its console script runs it, with the modules it loaded written out at
# its exit.
WRAPPER = """
import atexit, json, sys
out = sys.argv.pop(1)
atexit.register(lambda: open(out, "w").write(json.dumps(sorted(sys.modules))))
from sandcell.cli import main
sys.exit(main())
"""


@pytest.mark.slow
def test_a_server_without_telemetry_imports_none_of_opentelemetry(tmp_path: Path) -> None:
    data, config = tmp_path / "data", tmp_path / "sandcell.toml"
    config.write_text(SMALL_TEMPLATE.format(warm_pool=0))
    script, modules = tmp_path / "serve.py", tmp_path / "modules.json"
    script.write_text(WRAPPER)
    port = free_port()
    log = tmp_path / "serve.log"
    argv = [sys.executable, str(script), str(modules), "serve", "--port", str(port)]
    argv += ["--data-dir", str(data), "--config", str(config)]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    server = RunningServer(proc, f"http://127.0.0.1:{port}", data, config, log)
    try:
        _ready(server)
        key = server.create_key("quiet")
        with server.client(key) as api:
            created = api.post("/v1/sandboxes", json={}, headers={"traceparent": TRACEPARENT})
            assert created.status_code == 201, created.text
            sandbox = created.json()["id"]
            reply = api.post(
                f"/v1/sandboxes/{sandbox}/exec",
                json={"command": "true"},
                headers={"traceparent": TRACEPARENT},
            )
            assert reply.status_code == 200
            # Off, the caller's traceparent travels on as any end-to-end header: the daemon
            # times its steps and its header comes back (its own sandbox's, checked by nobody).
            spans = json.loads(reply.headers["sandcell-spans"])
            assert [s["n"] for s in spans] == ["exec.spawn", "exec.run"]
            api.delete(f"/v1/sandboxes/{sandbox}")
        server.stop(signal.SIGTERM)
        assert proc.returncode == 0, log.read_text()[-2000:]
    finally:
        stop_and_clean(server)
    loaded = json.loads(modules.read_text())
    assert "sandcell.router.middleware" in loaded  # it did serve
    assert "sandcell.telemetry.otel" not in loaded
    # redis-py imports the OpenTelemetry metrics SDK for its own observability whenever that
    # is installed (here it is, for these tests): those modules and no others.
    assert set(_otel(loaded)) <= set(_otel(_modules_of("import redis")))
    assert not [
        m for m in loaded if m.startswith(("opentelemetry.sdk.trace", "opentelemetry.exporter"))
    ]


def _otel(modules: list[str]) -> list[str]:
    return [m for m in modules if m == "opentelemetry" or m.startswith("opentelemetry.")]


def _modules_of(code: str) -> list[str]:
    program = f"import json, sys\n{code}\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, check=True)
    return json.loads(done.stdout)


def _ready(server: RunningServer) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise AssertionError(server.log.read_text()[-3000:])
        try:
            if httpx.get(f"{server.url}/readyz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise AssertionError("not ready")


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ('"ftp://collector:4318"', "http:// or https://"),
        ('"http://"', "with a host"),
        ('"http://collector:99999"', "is not a URL"),
        ('"http://user:pw@collector:4318"', "credentials"),
        ('"http://collector:4318/?x=1"', "no query"),
        ("4318", "must be a URL"),
        ('""', "must be a URL"),
    ],
)
def test_a_bad_otlp_endpoint_is_refused_by_name(tmp_path: Path, value: str, says: str) -> None:
    config = tmp_path / "sandcell.toml"
    config.write_text(f"[telemetry]\notlp_endpoint = {value}\n")
    with pytest.raises(ConfigError, match=r"\[telemetry\] otlp_endpoint") as raised:
        load_settings(config, tmp_path)
    assert says in str(raised.value)


def test_unknown_telemetry_keys_are_refused(tmp_path: Path) -> None:
    config = tmp_path / "sandcell.toml"
    config.write_text('[telemetry]\notlp_endpoint = "http://127.0.0.1:4318"\nsample = 0.5\n')
    with pytest.raises(ConfigError, match=r"\[telemetry\]: unknown keys \['sample'\]"):
        load_settings(config, tmp_path)


def test_the_endpoint_is_kept_and_spans_go_beneath_it(tmp_path: Path) -> None:
    from sandcell.telemetry import traces_url

    config = tmp_path / "sandcell.toml"
    config.write_text('[telemetry]\notlp_endpoint = "http://127.0.0.1:4318"\n')
    assert load_settings(config, tmp_path).otlp_endpoint == "http://127.0.0.1:4318"
    assert load_settings(None, tmp_path).otlp_endpoint == ""
    assert traces_url("http://c:4318") == "http://c:4318/v1/traces"
    assert traces_url("http://c:4318/otlp/") == "http://c:4318/otlp/v1/traces"
    assert traces_url("https://c/v1/traces") == "https://c/v1/traces"


def test_the_endpoint_without_the_sdk_is_refused_saying_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sandcell.telemetry

    monkeypatch.setattr(sandcell.telemetry, "SDK_MODULES", ("opentelemetry.sdk.nowhere.trace",))
    config = tmp_path / "sandcell.toml"
    config.write_text('[telemetry]\notlp_endpoint = "http://127.0.0.1:4318"\n')
    with pytest.raises(ConfigError, match=r"needs the OpenTelemetry SDK.*sandcell\[telemetry\]"):
        load_settings(config, tmp_path)
