"""The unmodified e2b-code-interpreter against sandcell's code contexts (port 49999)."""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
from collections.abc import Iterator

import pytest
from e2b_code_interpreter import Sandbox
from e2b_code_interpreter.charts import LineChart

from support.server import RunningServer, sandcell_bin

pytestmark = pytest.mark.slow
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def sbx() -> Iterator[Sandbox]:
    # `base` is sandcell's default template (the host's python, no image to build here).
    sandbox = Sandbox.create(template="base", timeout=300)
    yield sandbox
    sandbox.kill()


def test_state_stdout_and_errors(sbx: Sandbox) -> None:
    sbx.run_code("x = 40")
    seen: list[str] = []
    execution = sbx.run_code("print('hi')\nx + 2", on_stdout=lambda m: seen.append(m.line))
    assert execution.text == "42"
    # Output arrives as the kernel writes it, so "hi" and its newline may be two chunks.
    assert "".join(execution.logs.stdout) == "hi\n"
    assert "".join(seen) == "hi\n"
    assert execution.error is None
    failed = sbx.run_code("1 / 0")
    assert failed.error is not None and failed.error.name == "ZeroDivisionError"


def test_png_chart(sbx: Sandbox) -> None:
    execution = sbx.run_code(
        "import matplotlib.pyplot as plt\nplt.plot([1, 4, 9])\nplt.show()", timeout=120
    )
    assert execution.error is None, execution.error
    (chart,) = execution.results
    assert chart.png is not None
    assert base64.b64decode(chart.png).startswith(PNG_SIGNATURE)


def test_contexts(sbx: Sandbox) -> None:
    sbx.files.make_dir("/home/user/proj")
    ctx = sbx.create_code_context(cwd="/home/user/proj", language="python")
    assert ctx.cwd == "/home/user/proj"
    sbx.run_code("y = 'kept'", context=ctx)
    assert sbx.run_code("y", context=ctx).text == "'kept'"
    assert ctx.id in [c.id for c in sbx.list_code_contexts()]
    sbx.restart_code_context(ctx)
    assert sbx.run_code("y", context=ctx).error is not None
    sbx.remove_code_context(ctx)
    assert ctx.id not in [c.id for c in sbx.list_code_contexts()]
    bash = sbx.run_code("cd /tmp && export Z=1; echo $Z", language="bash")
    assert "".join(bash.logs.stdout) == "1\n"


@pytest.mark.skipif(
    not os.environ.get("SANDCELL_TEST_CODE_INTERPRETER") or shutil.which("mmdebstrap") is None,
    reason="builds the code-interpreter image (minutes); set SANDCELL_TEST_CODE_INTERPRETER=1",
)
@pytest.mark.timeout(1800)
def test_the_code_interpreter_template_has_charts_javascript_and_typescript(
    e2b_server: RunningServer,
) -> None:
    env = {
        **os.environ,
        "SANDCELL_URL": e2b_server.url,
        "SANDCELL_API_KEY": e2b_server.create_key("image-builder", admin=True),
    }
    built = subprocess.run(
        [sandcell_bin(), "template", "build", "code-interpreter"],
        capture_output=True,
        text=True,
        env=env,
        timeout=1500,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    # No template named: e2b-code-interpreter's default, code-interpreter-v1.
    sandbox = Sandbox.create(timeout=300)
    try:
        plotted = sandbox.run_code(
            "import matplotlib.pyplot as plt\nplt.plot([1, 2], [3, 4], label='up')\nplt.show()",
            timeout=120,
        )
        assert plotted.error is None and plotted.logs.stderr == [], plotted
        (figure,) = plotted.results
        assert isinstance(figure.chart, LineChart) and figure.png is not None
        assert [(e.label, e.points) for e in figure.chart.elements] == [("up", [(1, 3), (2, 4)])]
        js = sandbox.create_code_context(language="js")
        sandbox.run_code("const seen = ['node']", context=js)
        assert sandbox.run_code("seen.concat(process.version)", context=js).text.startswith(
            "[ 'node', 'v"
        )
        typed = sandbox.run_code("const n: number = 6 * 7\nconsole.log(n)", language="ts")
        assert typed.error is None and typed.logs.stdout == ["42\n"]
    finally:
        sandbox.kill()
