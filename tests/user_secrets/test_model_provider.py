"""docs/api.md's model-provider example, run: its sandbox code (`ASK`, taken from the doc
unchanged) uses the real `openai` SDK in a real cell with only a placeholder in
`OPENAI_API_KEY`, against an OpenAI-compatible HTTPS server on the host's loopback (its own
CA, trusted through `[server] upstream_ca_file`; the secret names `localhost`). The server sees
the real key; the cell prints the completion and holds the key nowhere."""

from __future__ import annotations

import ast
import http.server
import json
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from network.tls.conftest import Upstream, UpstreamCA
from network.tls.test_cells_e2e import SEARCH
from sandcell import Sandbox
from sandcell.client import ClientConfig
from sandcell.client.secrets import Secrets
from sandcell.isolation.runtime import CELL_VENV
from support.server import OPEN_TEMPLATE, RunningServer, start_server

pytestmark = pytest.mark.slow

KEY = "sk-proj-model-provider-0123456789abcdef"
COMPLETION = "Hello from the model, friend."
DOCS = Path(__file__).resolve().parents[2] / "docs" / "api.md"
CA = UpstreamCA.make("model provider test CA")
CONFIG = '\n[server]\nupstream_ca_file = "{ca}"\n' + OPEN_TEMPLATE + "network_internal = true\n"


def example_ask() -> str:
    """The `ASK` of docs/api.md's model-provider example, as the doc has it."""
    text = DOCS.read_text()
    start = text.index("**A model provider's SDK in the sandbox.**")
    block = text[text.index("```python\n", start) + len("```python\n") :]
    tree = ast.parse(block[: block.index("\n```")])
    (ask,) = (
        node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and [getattr(t, "id", "") for t in node.targets] == ["ASK"]
        and isinstance(node.value, ast.Constant)
    )
    assert "from openai import OpenAI" in ask
    return ask


def _completions(seen: list[dict]) -> type[http.server.BaseHTTPRequestHandler]:
    """An OpenAI-compatible chat completions endpoint: it answers only the real key, and
    keeps what it was sent in `seen`."""

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            headers = {k.lower(): v for k, v in self.headers.items()}
            seen.append({"path": self.path, "headers": headers, "body": body})
            if headers.get("authorization") != f"Bearer {KEY}":
                self._answer(401, {"error": {"message": "bad key", "type": "auth"}})
                return
            message = {"role": "assistant", "content": COMPLETION}
            self._answer(
                200,
                {
                    "id": "chatcmpl-test",
                    "object": "chat.completion",
                    "created": 0,
                    "model": body["model"],
                    "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 9, "completion_tokens": 6, "total_tokens": 15},
                },
            )

        def _answer(self, status: int, payload: dict) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    return Handler


class Provider(Upstream):
    """The tests' HTTPS upstream on loopback (its own CA), serving chat completions."""

    def __init__(self) -> None:
        super().__init__(CA.server_context("localhost"))
        self.server.RequestHandlerClass = _completions(self.seen.requests)  # before any request


@pytest.fixture(scope="module")
def provider() -> Iterator[Provider]:
    provider = Provider()
    yield provider
    provider.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("model-provider")
    (root / "ca.pem").write_bytes(CA.pem())
    srv = start_server(root / "data", config_text=CONFIG.format(ca=root / "ca.pem"))
    yield srv
    srv.stop()


def test_the_openai_sdk_in_a_cell_gets_a_completion_with_a_placeholder(
    server: RunningServer, provider: Provider
) -> None:
    config = ClientConfig(url=server.url, api_key=server.create_key("alice"))
    Secrets.set("OPENAI_API_KEY", KEY, ["localhost"], config=config)
    env = {
        "OPENAI_BASE_URL": f"https://localhost:{provider.port}/v1",
        "NO_PROXY": "",  # the provider is on loopback, which the cell's default bypasses
        "no_proxy": "",
    }
    network = {"egress": "allowlist", "allow": [f"127.0.0.1:{provider.port}"]}
    with Sandbox.create(config=config, secrets=["OPENAI_API_KEY"], env=env, network=network) as sbx:
        sbx.files.write("ask.py", example_ask())
        # The host template's Python with `openai` is the venv sandcell runs from.
        done = sbx.commands.run(f"{CELL_VENV}/bin/python ask.py", timeout=60)
        assert done.exit_code == 0, (done.stdout, done.stderr)
        assert done.stdout.strip() == COMPLETION

        (request,) = provider.seen.requests
        assert request["path"] == "/v1/chat/completions"
        assert request["headers"]["authorization"] == f"Bearer {KEY}"
        assert request["body"]["model"] == "gpt-4o-mini"
        placeholder = sbx.commands.run("printenv OPENAI_API_KEY").stdout.strip()
        assert placeholder.startswith("sandcell-secret-OPENAI_API_KEY-")

        # The key is nowhere in the cell: files, environs, process memory (a process that
        # stays, so there is more than the searcher); the same search finds the placeholder.
        sbx.commands.run("sleep 60", background=True)
        python = f"{CELL_VENV}/bin/python"
        for needle, found in ((KEY, False), (placeholder, True)):
            hexed = needle[::-1].encode().hex()
            out = sbx.commands.run(f"{python} -c {shlex.quote(SEARCH)} {hexed}", timeout=60)
            assert out.stdout.strip().endswith("searched"), out.stdout
            assert ("FOUND in the memory of" in out.stdout) is found, out.stdout
        assert KEY not in done.stdout + done.stderr
    assert KEY not in server.log.read_text()
