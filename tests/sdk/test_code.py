"""The code interpreter through a real `sandcell serve` and real cells: SDK (sync and async),
and the raw router API (NDJSON streaming proxied, errors in the §1 shape)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sandcell.client import ClientConfig, Context, Execution, NotFoundError, Result, Sandbox
from sandcell.client.errors import BadRequestError
from sdk.helpers import Flavour, daemon_pid, stop_and_clean
from support.server import SMALL_TEMPLATE, RunningServer, sandcell_bin, start_server

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
pytestmark = [pytest.mark.slow, pytest.mark.anyio]


@pytest.fixture(scope="module")
def code_sandbox(config: ClientConfig):
    """One sandbox whose python context has imported pandas and matplotlib once."""
    with Sandbox.create(config=config) as sbx:
        yield sbx.id


async def test_state_results_and_execution_fields(
    flavour: Flavour, config: ClientConfig, code_sandbox: str
):
    async with flavour.connected(code_sandbox, config) as sbx:
        ctx = await flavour(sbx.create_code_context())
        assert isinstance(ctx, Context) and ctx.language == "python" and ctx.cwd
        await flavour(sbx.run_code("import math\nbase = 40", context=ctx))
        execution = await flavour(sbx.run_code("print('hi')\nbase + math.floor(2.9)", context=ctx))
        assert isinstance(execution, Execution)
        assert execution.text == "42" and execution.error is None
        assert execution.logs.stdout == ["hi\n"] and execution.logs.stderr == []
        assert execution.execution_count == 2
        env = await flavour(sbx.run_code("import os; os.environ['ONE_RUN']", envs={"ONE_RUN": "1"}))
        assert env.text == "'1'"
        (main,) = execution.results
        assert isinstance(main, Result) and main.is_main_result and main.formats() == ["text"]
        await flavour(sbx.remove_code_context(ctx))


async def test_chart_and_dataframe(flavour: Flavour, config: ClientConfig, code_sandbox: str):
    async with flavour.connected(code_sandbox, config) as sbx:
        chart = await flavour(
            sbx.run_code(
                "import matplotlib.pyplot as plt\nplt.plot([1, 4, 9])\nplt.show()", timeout=120
            )
        )
        assert chart.error is None, chart.error
        (figure,) = chart.results
        assert "png" in figure.formats() and figure.image_bytes().startswith(PNG_SIGNATURE)
        frame = await flavour(sbx.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2]})"))
        (table,) = frame.results
        assert "<table" in table.html and table.text and frame.text == table.text


async def test_error_and_streaming_callbacks(
    flavour: Flavour, config: ClientConfig, code_sandbox: str
):
    seen: list[tuple[str, object]] = []
    async with flavour.connected(code_sandbox, config) as sbx:
        execution = await flavour(
            sbx.run_code(
                "import sys\nprint('out')\nprint('err', file=sys.stderr)\n"
                "from IPython.display import display\ndisplay('shown')\n1 / 0",
                on_stdout=lambda m: seen.append(("stdout", m.line)),
                on_stderr=lambda m: seen.append(("stderr", m.line)),
                on_result=lambda r: seen.append(("result", r.text)),
                on_error=lambda e: seen.append(("error", e.name)),
            )
        )
    assert execution.error.name == "ZeroDivisionError"
    assert execution.error.value == "division by zero" and "1 / 0" in execution.error.traceback
    # Output arrives in chunks as written (print's text and its newline may be two).
    merged: list[tuple[str, object]] = []
    for kind, value in seen:
        if merged and kind == merged[-1][0] and kind in ("stdout", "stderr"):
            merged[-1] = (kind, f"{merged[-1][1]}{value}")
        else:
            merged.append((kind, value))
    assert merged == [
        ("stdout", "out\n"),
        ("stderr", "err\n"),
        ("result", "'shown'"),
        ("error", "ZeroDivisionError"),
    ]
    assert execution.logs.stdout == ["out\n"] and execution.text is None


async def test_timeout_keeps_state_and_self_kill_restarts(
    flavour: Flavour, config: ClientConfig, code_sandbox: str
):
    async with flavour.connected(code_sandbox, config) as sbx:
        ctx = await flavour(sbx.create_code_context())
        await flavour(sbx.run_code("before = 'kept'", context=ctx))
        started = time.monotonic()
        stuck = await flavour(sbx.run_code("while True: pass", context=ctx, timeout=1))
        assert time.monotonic() - started < 10
        assert stuck.timed_out and stuck.error.name == "TimeoutError"
        assert (await flavour(sbx.run_code("before", context=ctx))).text == "'kept'"
        died = await flavour(sbx.run_code("import os; os._exit(1)", context=ctx))
        assert died.error.name == "ContextRestarted" and "restarted" in died.error.value
        after = await flavour(sbx.run_code("'before' in dir(), 1 + 1", context=ctx))
        assert after.text == "(False, 2)"
        await flavour(sbx.remove_code_context(ctx))


async def test_bash_contexts_and_restart(flavour: Flavour, config: ClientConfig, code_sandbox: str):
    async with flavour.connected(code_sandbox, config) as sbx:
        bash = await flavour(sbx.create_code_context(language="bash"))
        await flavour(sbx.run_code("mkdir -p d && cd d && export X=1", context=bash))
        r = await flavour(sbx.run_code('echo "$PWD:$X"', context=bash))
        assert r.logs.stdout == ["/workspace/d:1\n"]
        py_a = await flavour(sbx.create_code_context())
        py_b = await flavour(sbx.create_code_context())
        await flavour(sbx.run_code("v = 1", context=py_a))
        assert (await flavour(sbx.run_code("v", context=py_b))).error.name == "NameError"
        await flavour(sbx.restart_code_context(py_a))
        assert (await flavour(sbx.run_code("v", context=py_a))).error.name == "NameError"
        ids = {c.id for c in await flavour(sbx.list_code_contexts())}
        assert {bash.id, py_a.id, py_b.id} <= ids
        for ctx in (bash, py_a, py_b):
            await flavour(sbx.remove_code_context(ctx))
        with pytest.raises(NotFoundError):
            await flavour(sbx.run_code("1", context=py_a))
        with pytest.raises(BadRequestError):
            await flavour(sbx.run_code("1", language="cobol"))


def test_router_streams_ndjson_and_maps_errors(
    sdk_server: RunningServer, api_key: str, code_sandbox: str
):
    base = f"/v1/sandboxes/{code_sandbox}/code"
    with sdk_server.client(api_key) as http:
        body = {
            "code": "import time\nfor i in range(3):\n    print(i, flush=True); time.sleep(0.3)"
        }
        arrivals = []
        with http.stream(
            "POST", f"{base}/run", json=body, headers={"accept": "application/x-ndjson"}
        ) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                arrivals.append((time.monotonic(), json.loads(line)))
        kinds = [e["type"] for _, e in arrivals]
        assert kinds[-1] == "end" and kinds.count("stdout") >= 2
        assert arrivals[-1][0] - arrivals[0][0] > 0.4  # events came as they happened
        for payload, status in (
            ({"code": "1", "language": "nope"}, 400),
            ({"code": "1", "context_id": "ctx-none"}, 404),
        ):
            r = http.post(f"{base}/run", json=payload)
            assert r.status_code == status and r.json()["error"]["code"] in (
                "BAD_REQUEST",
                "NOT_FOUND",
            )
        r = http.post(f"{base}/contexts/..%2Finit/restart")
        assert r.status_code in (400, 404)


def test_memory_counts_against_the_cell(config: ClientConfig, sdk_server: RunningServer):
    """A context that eats memory loses its process (the OOM killer takes it, not the
    daemon): the run reports the restart and the sandbox keeps working."""
    with Sandbox.create(config=config) as sbx:
        r = sbx.run_code("hog = b'x' * (1 << 30)")  # 1 GiB, touched: over the 256 MiB cell
        assert r.error.name == "ContextRestarted" and "SIGKILL" in r.error.value
        assert sbx.run_code("2 + 2").text == "4"
        assert sbx.commands.run("echo alive").stdout == "alive\n"


def test_cli_prints_text_and_saves_images(
    sdk_server: RunningServer, api_key: str, code_sandbox: str, tmp_path: Path
):
    env = {"PATH": "/usr/bin:/bin", "SANDCELL_URL": sdk_server.url, "SANDCELL_API_KEY": api_key}

    def sandcell(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sandcell_bin(), "code", code_sandbox, *args],
            env=env, input=stdin, capture_output=True, text=True, timeout=120, cwd=tmp_path,
        )  # fmt: skip

    done = sandcell("-c", "cli_var = 6\nprint('hello')\ncli_var * 7")
    assert done.returncode == 0 and done.stdout == "hello\n42\n", done.stderr
    script = tmp_path / "chart.py"
    script.write_text("import matplotlib.pyplot as plt\nplt.plot([3, 1, 2])\nplt.show()\n")
    done = sandcell(str(script), "-o", "charts")
    assert done.returncode == 0, done.stderr
    assert "saved png to charts/result-1.png" in done.stderr
    assert (tmp_path / "charts" / "result-1.png").read_bytes().startswith(PNG_SIGNATURE)
    failed = sandcell("-", stdin="cli_var / 0\n")
    assert failed.returncode == 1 and "ZeroDivisionError" in failed.stderr
    bash = sandcell("-l", "bash", "-c", "echo from-bash")
    assert bash.returncode == 0 and bash.stdout == "from-bash\n"
    as_json = json.loads(sandcell("--json", "-c", "cli_var").stdout)
    assert as_json["results"][0]["text/plain"] == "6" and as_json["error"] is None
    missing = sandcell("--context", "ctx-none", "-c", "1")
    assert missing.returncode == 125 and missing.stderr.startswith("sandcell: NOT_FOUND: ")


def test_chart_example_saves_a_chart(config: ClientConfig, tmp_path: Path):
    example = Path(__file__).resolve().parents[2] / "examples" / "chart_analysis.py"
    env = {"PATH": "/usr/bin:/bin", "SANDCELL_URL": config.url, "SANDCELL_API_KEY": config.api_key}
    done = subprocess.run(
        [sys.executable, str(example), str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "360 rows loaded" in done.stdout and "north" in done.stdout
    chart = tmp_path / "revenue_by_month.png"
    assert chart.read_bytes().startswith(PNG_SIGNATURE) and chart.stat().st_size > 10_000


def test_a_context_cannot_kill_the_daemon(config: ClientConfig):
    """Contexts start through the spawner like commands (§9): the daemon is out of reach."""
    with Sandbox.create(config=config) as sbx:
        sbx.run_code("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)", timeout=10)
        assert sbx.commands.run("echo alive", timeout=10).stdout == "alive\n"


def test_contexts_die_with_their_sandbox(config: ClientConfig):
    sbx = Sandbox.create(config=config)
    try:
        for language in ("python", "bash"):
            sbx.run_code(
                "true" if language == "bash" else "0", context=sbx.create_code_context(language)
            )
        daemon = daemon_pid(sbx.id)
        kernels = [p for p in _children(daemon) if b"_driver." in _cmdline(p)]
        assert len(kernels) == 2, [_cmdline(p) for p in _children(daemon)]
    finally:
        sbx.kill()
        sbx.close()
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in kernels) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in kernels if _alive(p)]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _children(pid: int) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and (proc / "stat").read_text().rsplit(")", 1)[1].split()[
                1
            ] == str(pid):
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def test_the_template_chooses_the_interpreter(tmp_path: Path):
    """`code_python` per template: one without IPython says so; bash contexts still work."""
    config = SMALL_TEMPLATE.format(warm_pool=0) + (
        '\n[templates.plain]\nmemory_mb = 256\nwarm_pool = 0\ncode_python = "/usr/bin/python3"\n'
    )
    server = start_server(tmp_path / "data", config_text=config)
    try:
        cfg = ClientConfig(url=server.url, api_key=server.create_key("k"))
        with Sandbox.create("plain", config=cfg) as sbx:
            with pytest.raises(BadRequestError, match="IPython"):
                sbx.run_code("1 + 1")
            assert sbx.run_code("echo ok", language="bash").logs.stdout == ["ok\n"]
        with Sandbox.create(config=cfg) as sbx:
            assert sbx.run_code("1 + 1").text == "2"
    finally:
        stop_and_clean(server)
