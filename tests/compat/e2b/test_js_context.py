"""JavaScript and TypeScript contexts through the unmodified e2b-code-interpreter: Node.js in
the cell keeps a context's state across runs, with stdout, results and errors in the shapes
of python's."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest
from e2b.exceptions import SandboxException, TimeoutException
from e2b_code_interpreter import Sandbox

from sandcell.daemon.code import js_kernel
from sandcell.errors import ErrorCode, ServiceError

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sbx() -> Iterator[Sandbox]:
    if shutil.which("node") is None:
        pytest.skip("needs Node.js on the host (templates without an image run the host's)")
    sandbox = Sandbox.create(template="base", timeout=300)
    yield sandbox
    sandbox.kill()


def test_state_is_kept_across_runs_and_console_log_is_stdout(sbx: Sandbox) -> None:
    ctx = sbx.create_code_context(language="js")
    assert ctx.language == "javascript" and ctx.cwd == "/home/user"
    assert (
        sbx.run_code(
            "let total = 40; function add(n) { total += n; return total }", context=ctx
        ).error
        is None
    )
    seen: list[str] = []
    execution = sbx.run_code(
        "console.log('adding'); console.error('careful'); add(2)",
        context=ctx,
        on_stdout=lambda m: seen.append(m.line),
    )
    assert execution.error is None, execution.error
    assert execution.text == "42"
    assert "".join(execution.logs.stdout) == "adding\n" == "".join(seen)
    assert "".join(execution.logs.stderr) == "careful\n"
    assert sbx.run_code("({ total, kind: typeof add })", context=ctx).text == (
        "{ total: 42, kind: 'function' }"
    )
    sbx.files.write("/home/user/greet.js", "module.exports = (who) => `hello ${who}`")
    assert sbx.run_code("require('./greet.js')('node')", context=ctx).text == "'hello node'"
    assert ctx.id in [c.id for c in sbx.list_code_contexts()]
    sbx.restart_code_context(ctx)
    gone = sbx.run_code("total", context=ctx)
    assert gone.error is not None and gone.error.name == "ReferenceError"
    sbx.remove_code_context(ctx)


def test_an_error_is_an_execution_error_with_name_value_and_traceback(sbx: Sandbox) -> None:
    failed = sbx.run_code(
        "const boom = () => { throw new TypeError('bad input') }\nboom()", language="js"
    )
    assert failed.error is not None
    assert (failed.error.name, failed.error.value) == ("TypeError", "bad input")
    assert "at boom" in failed.error.traceback
    syntax = sbx.run_code("let = = 1", language="javascript")
    assert syntax.error is not None and syntax.error.name == "SyntaxError"
    # The default javascript context lives on after its errors.
    assert sbx.run_code("typeof boom", language="js").text == "'function'"


def test_promises_and_top_level_await(sbx: Sandbox) -> None:
    resolved = sbx.run_code("new Promise((ok) => setTimeout(() => ok(7), 10))", language="js")
    assert resolved.text == "7"
    awaited = sbx.run_code(
        "globalThis.later = await Promise.resolve('kept')\nconsole.log(later)", language="js"
    )
    assert awaited.error is None and "".join(awaited.logs.stdout) == "kept\n"
    rejected = sbx.run_code("await Promise.reject(new RangeError('no'))", language="js")
    assert rejected.error is not None and rejected.error.name == "RangeError"


def test_a_runaway_loop_times_out_and_the_context_keeps_its_state(sbx: Sandbox) -> None:
    ctx = sbx.create_code_context(language="javascript")
    sbx.run_code("var kept = 'yes'", context=ctx)
    with pytest.raises(TimeoutException):
        sbx.run_code("while (true) {}", context=ctx, timeout=2)
    # The client went away: the loop is interrupted (SIGINT), the state stays.
    assert sbx.run_code("kept", context=ctx).text == "'yes'"
    sbx.remove_code_context(ctx)


def test_typescript_has_its_types_stripped(sbx: Sandbox) -> None:
    ctx = sbx.create_code_context(language="ts")
    assert ctx.language == "typescript"
    code = (
        "interface P { x: number }\nconst p: P = { x: 2 }\n"
        "function sq(n: number): number { return n * n }"
    )
    assert sbx.run_code(code, context=ctx).error is None
    assert sbx.run_code("sq(p.x) as number", context=ctx).text == "4"
    bad = sbx.run_code("const q: = 1", context=ctx)
    assert bad.error is not None and bad.error.name == "SyntaxError"
    # The default typescript context is its own, apart from the one above.
    assert sbx.run_code("console.log((3 as number) ** 2)", language="ts").logs.stdout == ["9\n"]


def test_an_unknown_language_is_refused_by_name(sbx: Sandbox) -> None:
    with pytest.raises(SandboxException, match="unknown language 'cobol'"):
        sbx.run_code("x", language="cobol")


def test_a_sandbox_without_node_refuses_javascript_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(js_kernel, "FIXED_PATH", "/nonexistent")
    with pytest.raises(ServiceError) as refused:
        js_kernel.JavaScriptLanguage("typescript").check()
    assert refused.value.code == ErrorCode.BAD_REQUEST
    assert "typescript contexts need Node.js" in refused.value.message
    assert refused.value.details == {"field": "language", "language": "typescript"}
