"""A small HTTP server on the host's loopback, as the destination of a cell's egress: it
answers every GET with "hello from the host, <path>"."""

from __future__ import annotations

import http.server
import threading


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = f"hello from the host, {self.path}".encode()
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def host_server() -> tuple[http.server.ThreadingHTTPServer, int]:
    """The server, serving in a thread of its own, and its port (`shutdown()` stops it)."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, srv.server_address[1]
