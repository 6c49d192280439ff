"""The unmodified e2b-code-interpreter against sandcell's code contexts (port 49999)."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import pytest
from e2b_code_interpreter import Sandbox

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
