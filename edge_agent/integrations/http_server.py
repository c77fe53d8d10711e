"""A tiny `/metrics` HTTP endpoint on the standard library, in a thread of its own.

It serves text someone else keeps current (a callable), so a scrape never
waits on the agent: it reads the latest rendered text and returns. Bound to
127.0.0.1 by default; binding elsewhere is the config's explicit choice.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    body: Callable[[], str]
    content_type: str


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    # Scrapers keep connections open; a stuck one must not hold a thread forever.
    timeout = 10

    def do_GET(self) -> None:
        if self.path.split("?", 1)[0] != "/metrics":
            self.send_error(404, "only /metrics is served here")
            return
        body = self.server.body().encode()
        self.send_response(200)
        self.send_header("Content-Type", self.server.content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        # One line per scrape on stderr would drown the agent's own log.
        return


class MetricsServer:
    """Serves `body()` at GET /metrics until `close()`.

    Args:
        address: (host, port); port 0 picks a free one (see `port`).
        body: Returns the text to serve.
        content_type: The Content-Type header.

    Raises:
        OSError: The address cannot be bound.
    """

    def __init__(self, address: tuple[str, int], body: Callable[[], str], content_type: str):
        host, port = address
        server_class = _Server6 if ":" in host else _Server
        self._server = server_class((host, port), _Handler)
        self._server.body = body
        self._server.content_type = content_type
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="metrics-http", daemon=True
        )
        self._thread.start()

    @property
    def port(self) -> int:
        """The bound port."""
        port: int = self._server.server_address[1]
        return port

    def close(self, timeout: float = 2.0) -> None:
        """Stop serving and release the port."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout)
