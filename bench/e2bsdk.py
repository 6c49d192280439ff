"""SPEC §16's E2B figure: `commands.run("true")` through the unmodified e2b SDK and the /e2b
façade, beside the same call through sandcell's own SDK, against the same server in the same
run. The two run interleaved, one call each in turn, so that both see the same machine (a
shared 2-core box drifts more between two back-to-back loops than the figure is wide); the
façade's row carries the ratio of the medians and of the p99s, and the daemon calls one run
costs (the router's `sandcell_daemon_calls_total`, read before and after).

The SDK runs E2B's commands as `/bin/bash -l -c CMD`: a login shell, whose /etc/profile
forks `id -u`. A third row runs that same argv through sandcell's SDK, so the figure can
be told apart into what the shell costs in the cell and what the façade and the e2b
client add."""

from __future__ import annotations

import re
import time
from collections.abc import Callable

from e2b import Sandbox as E2bSandbox

from bench.figures import Row, Server, row
from sandcell import ClientConfig, Sandbox

WARMUP = 20
_CALLS = re.compile(r"^sandcell_daemon_calls_total\{[^}]*\} ([0-9.e+]+)$", re.M)


def _ms(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000


def daemon_calls(server: Server) -> float:
    """Every signed call the server's router has made to a daemon so far."""
    text = server.http.get("/metrics").text
    return sum(float(v) for v in _CALLS.findall(text))


def commands_run(server: Server, n: int) -> list[Row]:
    config = ClientConfig(url=server.srv.url, api_key=server.key)
    facade = f"{server.srv.url}/e2b"
    own_ms: list[float] = []
    login_ms: list[float] = []
    e2b_ms: list[float] = []
    login = ["/bin/bash", "-l", "-c", "true"]
    with Sandbox.create(config=config) as own:
        e2b = E2bSandbox.create(api_key=server.key, api_url=facade, sandbox_url=facade)
        try:
            for _ in range(WARMUP):
                own.commands.run("true")
                own.commands.run(login)
                e2b.commands.run("true")
            for _ in range(n):
                own_ms.append(_ms(lambda: own.commands.run("true")))
                login_ms.append(_ms(lambda: own.commands.run(login)))
                e2b_ms.append(_ms(lambda: e2b.commands.run("true")))
            before = daemon_calls(server)
            for _ in range(WARMUP):
                e2b.commands.run("true")
            calls = (daemon_calls(server) - before) / WARMUP
        finally:
            e2b.kill()
    base = row('sandcell SDK: commands.run("true")', own_ms)
    through = row(
        'e2b SDK via /e2b: commands.run("true")', e2b_ms, base, target="<= 1.3x the SDK's"
    )
    through["ratio"] = round(through["median_ms"] / base["median_ms"], 2)
    through["p99_ratio"] = round(through["p99_ms"] / base["p99_ms"], 2)
    through["daemon_calls_per_run"] = round(calls, 2)
    shell = row("sandcell SDK: commands.run([/bin/bash, -l, -c, true])", login_ms, base)
    shell["ratio"] = round(shell["median_ms"] / base["median_ms"], 2)
    over_shell = row('e2b SDK via /e2b: commands.run("true"), over the same argv', e2b_ms, shell)
    over_shell["ratio"] = round(over_shell["median_ms"] / shell["median_ms"], 2)
    over_shell["p99_ratio"] = round(over_shell["p99_ms"] / shell["p99_ms"], 2)
    return [base, through, shell, over_shell]
