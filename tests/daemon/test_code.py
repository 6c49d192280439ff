"""Code contexts (SPEC §10) against a real daemon: state, rich results, errors, timeouts."""

from __future__ import annotations

import base64
import json
import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from sandcell import tokens
from sandcell.cellapi.client import DaemonClient
from sandcell.daemon.code.contexts import MAX_CONTEXTS
from support.daemons import RunningDaemon, launch_daemon

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(autouse=True)
def _delete_new_contexts(client: DaemonClient) -> Iterator[None]:
    """Each test's contexts go with it (the daemon is shared, its contexts are counted)."""
    before = {c["id"] for c in client.signed_request("GET", "/v1/code/contexts").json()["contexts"]}
    yield
    for ctx in client.signed_request("GET", "/v1/code/contexts").json()["contexts"]:
        if ctx["id"] not in before:
            client.signed_request("DELETE", f"/v1/code/contexts/{ctx['id']}")


def run(client: DaemonClient, code: str, **fields: Any) -> dict[str, Any]:
    r = client.signed_request("POST", "/v1/code/run", json_body={"code": code, **fields})
    assert r.status_code == 200, r.text
    return r.json()


def stream(client: DaemonClient, code: str, **fields: Any) -> list[dict[str, Any]]:
    r = client.signed_request(
        "POST",
        "/v1/code/run",
        json_body={"code": code, **fields},
        headers={"accept": "application/x-ndjson"},
    )
    assert r.status_code == 200, r.text
    return [json.loads(line) for line in r.text.splitlines()]


def new_context(client: DaemonClient, language: str = "python", **fields: Any) -> str:
    r = client.signed_request(
        "POST", "/v1/code/contexts", json_body={"language": language, **fields}
    )
    assert r.status_code == 201, r.text
    return r.json()["id"]


def wait_gone(pid: int, timeout_s: float = 5) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.02)
    return False


def main_text(result: dict[str, Any]) -> str | None:
    mains = [r for r in result["results"] if r["is_main_result"]]
    return mains[0]["text/plain"] if mains else None


def test_state_persists_and_last_expression_is_main_result(
    client: DaemonClient, daemon: RunningDaemon
):
    first = run(client, "x = 20\nimport math")
    assert first["error"] is None and first["results"] == []
    second = run(client, "y = x + 1\nprint('side', y)\nmath.floor(2.5) + y * 2")
    assert second["stdout"] == ["side 21\n"]
    assert main_text(second) == "44"
    assert second["execution_count"] == first["execution_count"] + 1
    assert not (daemon.workspace / ".ipython").exists()  # no profile, no history file there


def test_matplotlib_figure_is_png(client: DaemonClient):
    r = run(
        client,
        "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()",
        timeout_s=120,
    )
    assert r["error"] is None, r["error"]
    pngs = [res for res in r["results"] if "image/png" in res]
    assert len(pngs) == 1 and not pngs[0]["is_main_result"]
    assert base64.b64decode(pngs[0]["image/png"]).startswith(PNG_SIGNATURE)


def test_figure_left_open_is_shown_at_the_end(client: DaemonClient):
    r = run(client, "import matplotlib.pyplot as plt\nfig = plt.figure(); plt.bar([1], [2])\n")
    assert [res for res in r["results"] if "image/png" in res]


def test_dataframe_has_html_and_display_adds_results(client: DaemonClient):
    r = run(
        client,
        "import pandas as pd\nfrom IPython.display import display, Markdown\n"
        "display(Markdown('**hi**'))\npd.DataFrame({'a': [1, 2], 'b': [3, 4]})",
    )
    assert r["error"] is None, r["error"]
    shown, main = r["results"]
    assert not shown["is_main_result"] and shown["text/markdown"] == "**hi**"
    assert main["is_main_result"] and "<table" in main["text/html"] and "a" in main["text/plain"]


def test_rich_reprs_and_json(client: DaemonClient):
    code = (
        "class Thing:\n"
        "    def _repr_html_(self): return '<b>thing</b>'\n"
        "    def _repr_json_(self): return {'k': [1, 2]}\n"
        "    def _repr_svg_(self): return '<svg/>'\n"
        "Thing()"
    )
    (main,) = run(client, code)["results"]
    assert main["text/html"] == "<b>thing</b>" and main["image/svg+xml"] == "<svg/>"
    assert main["application/json"] == {"k": [1, 2]}


def test_exception_is_200_with_name_value_traceback(client: DaemonClient):
    r = run(client, "def f():\n    return 1 / 0\nprint('before')\nf()")
    assert r["stdout"] == ["before\n"]
    error = r["error"]
    assert error["name"] == "ZeroDivisionError" and error["value"] == "division by zero"
    assert "1 / 0" in error["traceback"] and "\x1b[" not in error["traceback"]
    syntax = run(client, "def (:")["error"]
    assert syntax["name"] == "SyntaxError"


def test_matplotlib_magic_and_rich_images(client: DaemonClient):
    r = run(
        client,
        "%matplotlib inline\nimport matplotlib.pyplot as plt\n"
        "fig, ax = plt.subplots(); ax.plot([1, 2]); fig",
    )
    assert r["error"] is None, r["error"]
    assert any(res["is_main_result"] and "image/png" in res for res in r["results"]), r
    gui = run(client, "%gui qt")  # the magic reports errors on stderr
    assert "use %matplotlib inline" in "".join(gui["stderr"]), gui
    png = "class P:\n    def _repr_png_(self): return b'\\x89PNG\\r\\n\\x1a\\nraw'\nP()"
    (main,) = run(client, png)["results"]
    assert base64.b64decode(main["image/png"]) == PNG_SIGNATURE + b"raw"


def test_magics_and_shell_escapes(client: DaemonClient):
    r = run(client, "!echo from-shell $HOME\n%cd /\nimport os; os.getcwd()")
    assert "from-shell" in "".join(r["stdout"]), r
    assert main_text(r) == "'/'"
    listed = run(client, "files = !ls /\n'usr' in files")
    assert main_text(listed) == "True"
    run(client, "%cd -q ~")


def test_streaming_order(client: DaemonClient):
    events = stream(
        client,
        "import time\nprint('a', flush=True)\ntime.sleep(0.2)\nprint('b')\n"
        "from IPython.display import display\ndisplay(1)\n'done'",
    )
    kinds = [e["type"] for e in events]
    assert kinds[-1] == "end" and events[-1]["execution_count"] >= 1
    assert "".join(e["text"] for e in events if e["type"] == "stdout") == "a\nb\n"
    assert kinds.index("stdout") < kinds.index("result")
    assert [e["is_main_result"] for e in events if e["type"] == "result"] == [False, True]


def test_env_applies_to_one_run_and_comes_from_the_allow_list(client: DaemonClient):
    r = run(
        client,
        "import os; os.environ.get('RUN_VAR'), os.environ.get('SANDBOX_DEFAULT')",
        env={"RUN_VAR": "v1"},
    )
    assert main_text(r) == "('v1', 'from-template')"
    names = "sorted(k for k in os.environ if 'SECRET' in k or k.startswith('SANDCELL'))"
    leaked = run(client, f"import os; {names}")
    assert main_text(leaked) == "[]"
    assert main_text(run(client, "os.environ.get('RUN_VAR')")) is None


@pytest.mark.slow
def test_timeout_interrupts_and_keeps_state(client: DaemonClient):
    ctx = new_context(client)
    run(client, "kept = 42", context_id=ctx)
    started = time.monotonic()
    r = run(client, "while True: pass", context_id=ctx, timeout_s=1)
    assert time.monotonic() - started < 5
    assert r["timed_out"] and r["error"]["name"] == "TimeoutError", r
    assert "keeps its state" in r["error"]["value"]
    assert main_text(run(client, "kept", context_id=ctx)) == "42"


@pytest.mark.slow
def test_stuck_interrupt_restarts_the_context(client: DaemonClient):
    ctx = new_context(client)
    run(client, "kept = 1", context_id=ctx)
    code = (
        "import signal, time\n"
        "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "while True: time.sleep(0.01)"
    )
    started = time.monotonic()
    r = run(client, code, context_id=ctx, timeout_s=0.5)
    assert time.monotonic() - started < 8
    assert r["timed_out"] and "restarted" in r["error"]["value"]
    after = run(client, "'kept' in dir()", context_id=ctx)
    assert main_text(after) == "False"


def test_kernel_that_kills_itself_is_restarted(client: DaemonClient):
    ctx = new_context(client)
    run(client, "x = 1", context_id=ctx)
    child = main_text(
        run(client, "import subprocess\nsubprocess.Popen(['sleep', '60']).pid", context_id=ctx)
    )
    r = run(client, "print('going'); import os; os._exit(3)", context_id=ctx)
    assert r["error"]["name"] == "ContextRestarted" and "exited with code 3" in r["error"]["value"]
    assert "python context's process ended" in r["error"]["value"]
    assert "restarted" in r["error"]["value"] and r["stdout"] == ["going\n"]
    assert main_text(run(client, "'x' in dir(), 2 + 2", context_id=ctx)) == "(False, 4)"
    assert wait_gone(int(child)), "what the dead kernel started dies with it"


def test_restart_clears_state_and_contexts_are_separate(client: DaemonClient):
    a, b = new_context(client), new_context(client)
    run(client, "v = 'a'", context_id=a)
    assert run(client, "v", context_id=b)["error"]["name"] == "NameError"
    r = client.signed_request("POST", f"/v1/code/contexts/{a}/restart", content=b"")
    assert r.status_code == 204, r.text
    assert run(client, "v", context_id=a)["error"]["name"] == "NameError"
    listed = client.signed_request("GET", "/v1/code/contexts").json()["contexts"]
    assert {a, b} <= {c["id"] for c in listed}
    for ctx in (a, b):
        assert client.signed_request("DELETE", f"/v1/code/contexts/{ctx}").status_code == 204
    gone = client.signed_request("POST", "/v1/code/run", json_body={"code": "1", "context_id": a})
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "NOT_FOUND"


def test_context_cwd(client: DaemonClient, daemon: RunningDaemon):
    (daemon.workspace / "proj").mkdir(exist_ok=True)
    ctx = new_context(client, cwd="proj")
    assert main_text(run(client, "import os; os.getcwd()", context_id=ctx)) == repr(
        str(daemon.workspace / "proj")
    )
    r = client.signed_request("POST", "/v1/code/contexts", json_body={"cwd": "../.."})
    assert r.status_code == 403


def test_bash_keeps_cd_and_exports(client: DaemonClient, daemon: RunningDaemon):
    ctx = new_context(client, "bash")
    setup = "mkdir -p bashdir && cd bashdir\nexport GREETING=hello\nlocal_var=5"
    run(client, setup, context_id=ctx)
    check = "echo \"$PWD $GREETING $local_var\"; sh -c 'echo child=$GREETING'"
    r = run(client, check, context_id=ctx)
    assert r["stdout"] == [f"{daemon.workspace}/bashdir hello 5\n", "child=hello\n"], r
    assert r["error"] is None
    failed = run(client, "echo out; echo err >&2; false", context_id=ctx)
    assert failed["error"]["name"] == "ExitCodeError" and failed["stderr"] == ["err\n"]
    with_env = run(client, 'echo "$ONLY_NOW"', context_id=ctx, env={"ONLY_NOW": "x y"})
    assert with_env["stdout"] == ["x y\n"]
    assert run(client, 'echo "[$ONLY_NOW]"', context_id=ctx)["stdout"] == ["[]\n"]
    # Commands that read stdin get nothing: not the rest of the code (a large one included).
    reader = run(client, "cat; echo after\n" + ": filler\n" * 20_000 + "echo end", context_id=ctx)
    assert reader["stdout"] == ["after\n", "end\n"] and reader["error"] is None
    odd = run(client, "printf 'a\\rb\\x0c\\n'; echo 'x\x0cy'", context_id=ctx)  # not line ends
    assert odd["stdout"] == ["a\rb\x0c\n", "x\x0cy\n"], odd
    default = run(client, "echo $((6 * 7))", language="bash")
    assert default["stdout"] == ["42\n"]


@pytest.mark.slow
def test_bash_timeout_keeps_the_shell(client: DaemonClient):
    ctx = new_context(client, "bash")
    run(client, "kept=yes", context_id=ctx)
    r = run(client, "while :; do :; done", context_id=ctx, timeout_s=0.5)
    assert r["timed_out"] and r["error"]["name"] == "TimeoutError"
    r = run(client, "sleep 30", context_id=ctx, timeout_s=0.5)
    assert r["timed_out"]
    assert run(client, "echo $kept", context_id=ctx)["stdout"] == ["yes\n"]


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"code": "1", "language": "cobol"}, 400),
        ({"code": "1", "context_id": "ctx-nope"}, 404),
        ({"code": "a\u0000b"}, 400),
        ({"code": "1", "timeout_s": 0}, 400),
        ({"code": "1", "env": {"A=B": "x"}}, 400),
        ({"code": 1}, 400),
        ({}, 400),
    ],
)
def test_bad_input(client: DaemonClient, body: dict[str, Any], status: int):
    r = client.signed_request("POST", "/v1/code/run", json_body=body)
    assert r.status_code == status, r.text
    assert r.json()["error"]["code"] in ("BAD_REQUEST", "NOT_FOUND")


def test_bad_context_requests(client: DaemonClient):
    r = client.signed_request("POST", "/v1/code/contexts", json_body={"language": "ruby"})
    assert r.status_code == 400
    r = client.signed_request("POST", "/v1/code/contexts/ctx-nope/restart", content=b"")
    assert r.status_code == 404
    assert client.signed_request("DELETE", "/v1/code/contexts/ctx-nope").status_code == 404
    bash = new_context(client, "bash")
    r = client.signed_request(
        "POST", "/v1/code/run", json_body={"code": "1", "context_id": bash, "language": "python"}
    )
    assert r.status_code == 400
    r = client.signed_request(
        "POST", "/v1/code/run", json_body={"code": "echo", "context_id": bash, "env": {"a-b": "1"}}
    )
    assert r.status_code == 400


def test_output_flood_is_capped(client: DaemonClient):
    r = run(
        client,
        "import sys\nfor _ in range(2000): sys.stdout.write('x' * 1000)\n'end'",
        max_output_bytes=10_000,
    )
    assert len("".join(r["stdout"])) == 10_000 and r["stdout_truncated"]
    assert main_text(r) == "'end'"


def test_binary_junk_never_breaks_the_stream(client: DaemonClient):
    code = (
        "import os, sys\n"
        "os.write(1, bytes(range(256)))\n"
        "from IPython.display import display\n"
        "display({'text/plain': '\\ud800 lone', 'image/png': b'\\x00\\xff'}, raw=True)\n"
        "'\\udcff'"
    )
    events = stream(client, code)
    assert events[-1]["type"] == "end"
    results = [e for e in events if e["type"] == "result"]
    assert len(results) == 2
    cyclic = "d = {'text/plain': 'cyc'}; d['application/json'] = d\ndisplay(d, raw=True)\n'ok'"
    r = run(client, "from IPython.display import display\n" + cyclic)
    assert [res["text/plain"] for res in r["results"]] == ["cyc", "'ok'"], r


def test_python_without_ipython_says_so(tmp_path: Path):
    """A template whose python lacks IPython: a 400 that names what is missing."""
    daemon = launch_daemon(tmp_path, "--code-python", "/usr/bin/python3")
    try:
        daemon.initialize()
        with daemon.client() as client:
            r = client.signed_request("POST", "/v1/code/run", json_body={"code": "1"})
            assert r.status_code == 400, r.text
            assert "IPython" in r.json()["error"]["message"]
            assert "code-interpreter template" in r.json()["error"]["message"]
            bash = run(client, "echo still-fine", language="bash")
            assert bash["stdout"] == ["still-fine\n"]
    finally:
        daemon.stop()


def test_contexts_hold_no_daemon_socket_or_secret(client: DaemonClient):
    """The attack: look for the daemon's listening socket or its other fds among the
    context's inherited descriptors, and for its environment."""
    fds = (
        "import os\n"
        "def target(fd):\n"
        "    try: return os.readlink(f'/proc/self/fd/{fd}')\n"
        "    except OSError: return ''\n"
        "sorted(target(fd) for fd in os.listdir('/proc/self/fd'))"
    )
    held = main_text(run(client, fds))
    assert "socket:" not in held and held.count("pipe:") <= 4, held
    shell = run(client, "ls -l /proc/$$/fd/ | grep -c socket; env | grep -c -e SANDCELL -e SECRET",
                language="bash")  # fmt: skip
    assert shell["stdout"] == ["0\n", "0\n"], shell


def test_contexts_are_limited(client: DaemonClient):
    listed = client.signed_request("GET", "/v1/code/contexts").json()["contexts"]
    made = [new_context(client, "bash") for _ in range(MAX_CONTEXTS - len(listed))]
    r = client.signed_request("POST", "/v1/code/contexts", json_body={"language": "bash"})
    assert r.status_code == 429 and r.json()["error"]["code"] == "RATE_LIMITED"
    client.signed_request("DELETE", f"/v1/code/contexts/{made[0]}")
    new_context(client, "bash")


def test_empty_code_and_exit_in_bash(client: DaemonClient):
    assert run(client, "")["error"] is None
    assert run(client, "# only a comment\n")["error"] is None
    ctx = new_context(client, "bash")
    gone = run(client, "echo bye; exit 4", context_id=ctx)
    assert gone["error"]["name"] == "ContextRestarted" and "code 4" in gone["error"]["value"]
    assert run(client, "echo back", context_id=ctx)["stdout"] == ["back\n"]


def test_restart_spares_background_processes_of_commands(
    client: DaemonClient, daemon: RunningDaemon
):
    """A context lives long: killing it must not sweep up what exec commands left running."""
    ctx = new_context(client)
    run(client, "started = True", context_id=ctx)
    pid_file = daemon.workspace / "background.pid"
    client.exec(f"setsid sh -c 'echo $$ > {pid_file}; exec sleep 60' >/dev/null 2>&1 &")
    deadline = time.monotonic() + 5
    while not pid_file.exists() or not pid_file.read_text().strip():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    background = int(pid_file.read_text())
    try:
        assert client.signed_request("POST", f"/v1/code/contexts/{ctx}/restart").status_code == 204
        run(client, "import os; os._exit(9)", context_id=ctx)  # and a kernel that dies
        state = Path(f"/proc/{background}/stat").read_text().rsplit(")", 1)[1].split()[0]
        assert state not in ("Z", "X")  # alive, not a killed zombie waiting to be reaped
    finally:
        os.kill(background, signal.SIGKILL)


def test_a_context_that_died_between_runs_says_so(client: DaemonClient):
    ctx = new_context(client)
    pid = main_text(run(client, "import os; kept = 1; os.getpid()", context_id=ctx))
    client.exec(f"kill -9 {pid}")
    time.sleep(0.2)
    r = run(client, "'kept' in dir()", context_id=ctx)
    assert main_text(r) == "False" and "killed by SIGKILL" in r["stderr"][0], r


def test_restart_stops_a_running_run(client: DaemonClient, daemon: RunningDaemon):
    ctx = new_context(client)
    run(client, "import time", context_id=ctx)
    with ThreadPoolExecutor(1) as pool, daemon.client() as other:
        running = pool.submit(run, other, "time.sleep(60)", context_id=ctx)
        time.sleep(0.5)
        started = time.monotonic()
        restart = client.signed_request("POST", f"/v1/code/contexts/{ctx}/restart")
        r = running.result(timeout=10)
    assert restart.status_code == 204 and time.monotonic() - started < 5
    assert r["error"]["name"] == "ContextRestarted"
    assert r["error"]["value"] == "the context was restarted during this run"
    assert main_text(run(client, "'time' in dir()", context_id=ctx)) == "False"


def test_a_client_that_goes_away_interrupts_its_run(client: DaemonClient, daemon: RunningDaemon):
    ctx = new_context(client)
    run(client, "kept = 'yes'", context_id=ctx)
    with daemon.client() as other:
        body = json.dumps({"code": "print('go', flush=True)\nwhile True: pass", "context_id": ctx})
        request = other.http.build_request(
            "POST", "/v1/code/run", content=body.encode(),
            headers={"accept": "application/x-ndjson", "content-type": "application/json"},
        )  # fmt: skip
        token = tokens.mint_request_token(
            daemon.session_key, daemon.sandbox_id, "POST", "/v1/code/run", body.encode()
        )
        request.headers["authorization"] = f"Bearer {token}"
        response = other.http.send(request, stream=True)
        assert json.loads(next(response.iter_lines()))["type"] == "stdout"
        response.close()  # gone mid-run
    started = time.monotonic()
    r = run(client, "kept", context_id=ctx, timeout_s=10)
    assert main_text(r) == "'yes'" and time.monotonic() - started < 5, r
