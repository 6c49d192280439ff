"""`python -m bench traces`: exec through the router with telemetry on (SPEC §20), beside the
same figure of a server with telemetry off, in the same run.

Two servers, one without `[telemetry]`, one exporting OTLP/HTTP to a receiver on loopback
(it decodes what it gets, as a collector would, and counts the spans). The execs alternate
between them in blocks, so a machine's drift falls on both figures alike.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from bench.figures import WARMUP, Row, Server, process_cpu_s, row
from bench.stats import sample_ms

BLOCK = 50  # execs on one server before the other's turn


class Receiver:
    """An OTLP/HTTP traces endpoint on loopback that counts the spans it is sent."""

    def __init__(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        self.spans = 0
        self.runs = 0  # `exec.run` spans: one per exec, from the daemon's answer
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                request = ExportTraceServiceRequest.FromString(body)
                spans = [
                    s for rs in request.resource_spans for sc in rs.scope_spans for s in sc.spans
                ]
                receiver.spans += len(spans)
                receiver.runs += sum(s.name == "exec.run" for s in spans)
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def figures(tmp: Path, n: int) -> list[Row]:
    receiver = Receiver()
    (tmp / "off").mkdir()
    (tmp / "on").mkdir()
    off = Server(tmp / "off", warm_pool=1)
    on = None
    try:
        on = Server(tmp / "on", 1, f'\n[telemetry]\notlp_endpoint = "{receiver.url}"\n')
        rows = _interleaved(off, on, n)
    finally:
        for server in (off, on):
            if server is not None:
                server.close()  # its queued spans are exported before it exits
        receiver.close()
    rows[1]["spans_received"] = receiver.spans
    rows[1]["exec_run_spans_received"] = receiver.runs  # of n + WARMUP execs
    return rows


def _interleaved(off: Server, on: Server, n: int) -> list[Row]:
    sandboxes = {id(off): off.create(), id(on): on.create()}
    samples: dict[int, list[float]] = {id(off): [], id(on): []}
    cpu = {id(off): 0.0, id(on): 0.0}
    for server in (off, on):
        sample_ms(lambda s=server: s.exec_true(sandboxes[id(s)]), 0, WARMUP)
    done = 0
    while done < n:
        block = min(BLOCK, n - done)
        for server in (off, on):
            before = process_cpu_s(server.srv.proc.pid)
            samples[id(server)] += sample_ms(
                lambda s=server: s.exec_true(sandboxes[id(s)]), block, 0
            )
            cpu[id(server)] += process_cpu_s(server.srv.proc.pid) - before
        done += block
    for server in (off, on):
        server.delete(sandboxes[id(server)])
    base = row("exec true through the router, telemetry off", samples[id(off)])
    traced = row(
        "exec true through the router, telemetry on (OTLP/HTTP to a loopback receiver)",
        samples[id(on)],
        base,
        "reported (SPEC §20)",
    )
    for out, server in ((base, off), (traced, on)):
        out["router_cpu_ms_per_exec"] = round(cpu[id(server)] * 1000 / n, 3)
    return [base, traced]
