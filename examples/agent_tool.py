"""A tool an LLM agent calls to run the Python code it wrote, in a sandcell sandbox.

The model never touches this machine: its code runs in an isolated, disposable sandbox with
no network, bounded CPU, memory, disk and time; whatever happens comes back as data the
model can read (output, the exception, "timed out"), never as an exception in the agent.

    export SANDCELL_URL=http://127.0.0.1:8700 SANDCELL_API_KEY=sc_...   # sandcell keys create
    python examples/agent_tool.py
"""

from __future__ import annotations

import json
from typing import Any

from sandcell import Sandbox, SandcellError

# Function-calling schema to hand to the model (OpenAI/Anthropic style "tools").
TOOL_SPEC = {
    "name": "run_python",
    "description": (
        "Run a Python 3 program in a fresh, isolated sandbox without network access and "
        "return its stdout, stderr and exit code. Files written under the current directory "
        "persist between calls of the same session."
    ),
    "input_schema": {
        "type": "object",
        "properties": {
            "code": {"type": "string", "description": "the complete program"},
            "timeout_s": {"type": "number", "description": "seconds, at most 120"},
        },
        "required": ["code"],
    },
}

MAX_CHARS = 10_000  # what the model gets back, per stream
MAX_TIMEOUT_S = 120


def _clip(text: str) -> str:
    if len(text) <= MAX_CHARS:
        return text
    half = MAX_CHARS // 2
    return f"{text[:half]}\n... [{len(text) - MAX_CHARS} characters cut] ...\n{text[-half:]}"


class PythonTool:
    """One sandbox per agent session: files the model writes survive from call to call.

    Use as a context manager so the sandbox is deleted when the session ends; it also expires
    on its own after `idle_timeout_s` without calls.
    """

    def __init__(self, idle_timeout_s: int = 600, template: str = "default") -> None:
        self.idle_timeout_s = idle_timeout_s
        self.template = template
        self._sandbox: Sandbox | None = None

    def __enter__(self) -> PythonTool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._sandbox is not None:
            try:
                self._sandbox.kill()
            finally:
                self._sandbox.close()
                self._sandbox = None

    def _sbx(self) -> Sandbox:
        if self._sandbox is None:
            self._sandbox = Sandbox.create(self.template, timeout=self.idle_timeout_s)
        return self._sandbox

    def run_python(self, code: str, timeout_s: float = 30) -> dict[str, Any]:
        """What the tool returns to the model: always a dict, never an exception."""
        timeout_s = min(max(float(timeout_s), 1.0), MAX_TIMEOUT_S)
        try:
            sbx = self._sbx()
            sbx.files.write("main.py", code)
            r = sbx.commands.run(
                ["python3", "main.py"], timeout=timeout_s, max_output_bytes=4 * MAX_CHARS
            )
        except SandcellError as exc:
            if exc.code == "SANDBOX_NOT_FOUND":  # expired while the model was thinking
                self._sandbox = None
            return {"ok": False, "error": f"the sandbox failed: {exc.code}: {exc.message}"}
        result: dict[str, Any] = {
            "ok": r.exit_code == 0,
            "exit_code": r.exit_code,
            "stdout": _clip(r.stdout),
            "stderr": _clip(r.stderr),
        }
        if r.timed_out:
            result["error"] = f"timed out after {timeout_s:g} s: the program was killed"
        elif r.signal is not None:
            result["error"] = f"killed by signal {r.signal} (out of memory?)"
        if r.stdout_truncated or r.stderr_truncated:
            result["note"] = "output was cut: print less"
        return result


def run_python(code: str, timeout_s: float = 30) -> dict[str, Any]:
    """One-shot variant: a throw-away sandbox for a single program."""
    with PythonTool(idle_timeout_s=max(int(timeout_s) + 60, 60)) as tool:
        return tool.run_python(code, timeout_s)


def main() -> None:
    with PythonTool() as tool:
        calls = [
            ("a computation", "import math\nprint(sum(math.factorial(n) for n in range(10)))"),
            ("state kept between calls", "open('notes.txt', 'w').write('remember me')"),
            ("... and read back", "print(open('notes.txt').read())"),
            ("an exception", "def f(x):\n    return 1 / x\nf(0)"),
            ("no network", "import urllib.request\nurllib.request.urlopen('http://1.1.1.1')"),
            ("a runaway loop, killed", "while True:\n    pass"),
        ]
        for title, code in calls:
            timeout = 2 if "loop" in title else 30
            result = tool.run_python(code, timeout_s=timeout)
            print(f"## {title}\n{json.dumps(result, indent=2)}\n")


if __name__ == "__main__":
    main()
