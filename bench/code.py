"""The code interpreter's figures (SPEC §10): a warm context's round trip, a new context's
first run, each beside its baseline."""

from __future__ import annotations

import sys

from bench.figures import Row, Server, _run, row
from bench.stats import sample_ms

IPYTHON_START = "from IPython.core.interactiveshell import InteractiveShell as S; S.instance()"


def code_interpreter(server: Server, n: int, starts: int) -> list[Row]:
    sandbox_id = server.create()
    base = f"/v1/sandboxes/{sandbox_id}/code"

    def run_code(context_id: str) -> None:
        r = server.http.post(f"{base}/run", json={"code": "1+1", "context_id": context_id})
        r.raise_for_status()
        assert r.json()["results"][0]["text/plain"] == "2"

    def new_context_first_run() -> None:
        r = server.http.post(f"{base}/contexts", json={"language": "python"})
        r.raise_for_status()
        run_code(r.json()["id"])
        server.http.delete(f"{base}/contexts/{r.json()['id']}").raise_for_status()

    try:
        exec_base = row(
            "exec true through the router (same sandbox)",
            sample_ms(lambda: server.exec_true(sandbox_id), n),
        )
        warm = server.http.post(f"{base}/contexts", json={"language": "python"}).json()["id"]
        round_trip = row(
            'run_code("1+1") in a warm python context, through the router',
            sample_ms(lambda: run_code(warm), n),
            exec_base,
        )
        start_base = row(
            "bare python: import IPython, make an InteractiveShell",
            sample_ms(_run([sys.executable, "-c", IPYTHON_START]), starts, warmup=2),
        )
        first_run = row(
            "new python context: create + first run_code + delete",
            sample_ms(new_context_first_run, starts, warmup=1),
            start_base,
        )
    finally:
        server.delete(sandbox_id)
    return [exec_base, round_trip, start_base, first_run]
