"""SPEC §14's cost: `commands.run("true")` through the unmodified e2b SDK and the /e2b façade,
beside the same call through sandcell's own SDK, against the same server in the same run."""

from __future__ import annotations

from e2b import Sandbox as E2bSandbox

from bench.figures import Row, Server, row
from bench.stats import sample_ms
from sandcell import ClientConfig, Sandbox


def commands_run(server: Server, n: int) -> list[Row]:
    config = ClientConfig(url=server.srv.url, api_key=server.key)
    with Sandbox.create(config=config) as own:
        base = row(
            'sandcell SDK: commands.run("true")', sample_ms(lambda: own.commands.run("true"), n)
        )
    facade = f"{server.srv.url}/e2b"
    e2b = E2bSandbox.create(api_key=server.key, api_url=facade, sandbox_url=facade)
    try:
        through = row(
            'e2b SDK via /e2b: commands.run("true")',
            sample_ms(lambda: e2b.commands.run("true"), n),
            base,
        )
    finally:
        e2b.kill()
    return [base, through]
