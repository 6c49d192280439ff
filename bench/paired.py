"""Exec through the router on two servers that differ in one setting, in the same run: the
execs alternate between them in blocks, so a machine's drift falls on both figures alike.
Each figure carries the router's CPU per exec, which load on a shared machine blurs less than
latency."""

from __future__ import annotations

from bench.figures import WARMUP, Row, Server, process_cpu_s, row
from bench.stats import sample_ms

BLOCK = 50  # execs on one server before the other's turn


def interleaved_execs(
    base: Server, other: Server, n: int, names: tuple[str, str], target: str
) -> list[Row]:
    """Rows for `base` and `other` (named by `names`), `other`'s beside `base`'s."""
    servers = (base, other)
    sandboxes = [server.create() for server in servers]
    samples: list[list[float]] = [[], []]
    cpu = [0.0, 0.0]
    for server, sandbox in zip(servers, sandboxes, strict=True):
        sample_ms(lambda s=server, b=sandbox: s.exec_true(b), 0, WARMUP)
    done = 0
    while done < n:
        block = min(BLOCK, n - done)
        for i, (server, sandbox) in enumerate(zip(servers, sandboxes, strict=True)):
            before = process_cpu_s(server.srv.proc.pid)
            samples[i] += sample_ms(lambda s=server, b=sandbox: s.exec_true(b), block, 0)
            cpu[i] += process_cpu_s(server.srv.proc.pid) - before
        done += block
    for server, sandbox in zip(servers, sandboxes, strict=True):
        server.delete(sandbox)
    first = row(names[0], samples[0])
    second = row(names[1], samples[1], first, target)
    for out, used in ((first, cpu[0]), (second, cpu[1])):
        out["router_cpu_ms_per_exec"] = round(used * 1000 / n, 3)
    return [first, second]
