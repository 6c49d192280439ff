"""`python -m bench traces`: exec through the router with telemetry on (SPEC §20), beside the
same figure of a server with telemetry off, in the same run.

Two servers, one without `[telemetry]`, one exporting OTLP/HTTP to a receiver on loopback
(it decodes what it gets, as a collector would, and counts the spans), their execs
interleaved (`bench.paired`).
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from bench.figures import Row, Server
from bench.paired import interleaved_execs


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
        rows = interleaved_execs(
            off,
            on,
            n,
            (
                "exec true through the router, telemetry off",
                "exec true through the router, telemetry on (OTLP/HTTP to a loopback receiver)",
            ),
            "reported (SPEC §20)",
        )
    finally:
        for server in (off, on):
            if server is not None:
                server.close()  # its queued spans are exported before it exits
        receiver.close()
    rows[1]["spans_received"] = receiver.spans
    rows[1]["exec_run_spans_received"] = receiver.runs  # of n + WARMUP execs
    return rows
