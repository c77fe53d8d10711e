"""A tiny `/metrics` HTTP endpoint on the standard library, in a thread of its own.

It serves text someone else keeps current (a callable), so a scrape never
waits on the agent: it reads the latest rendered text and returns. Bound to
127.0.0.1 by default; binding elsewhere is the config's explicit choice.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from edge_agent.logs import Throttle, error_text, log_event

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 8
"""Connections served at once; one past it is closed unanswered. Unbounded, a client
holding about 1,000 half-sent requests used up the agent's descriptors (systemd's default
soft limit is 1,024), and with them its MQTT link, its sqlite files and its cameras."""
REQUEST_S = 10.0
"""The longest a connection is kept, whole: the handler's timeout is per read, and a client
sending a byte every few seconds kept its thread and descriptor for as long as it liked."""


def _cut(request: socket.socket) -> None:
    # From the deadline's thread: the handler's blocked read returns, and it ends.
    with contextlib.suppress(OSError):
        request.shutdown(socket.SHUT_RDWR)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    body: Callable[[], str]
    content_type: str

    def server_activate(self) -> None:
        super().server_activate()
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._said = Throttle(60.0)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)  # busy: a scraper tries again at its next scrape
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        deadline = threading.Timer(REQUEST_S, _cut, (request,))
        deadline.daemon = True
        deadline.start()
        try:
            super().process_request_thread(request, client_address)
        finally:
            deadline.cancel()
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # The standard library prints a traceback to stderr, the journal under systemd: one
        # per reset connection, 23 lines each, flooded journald's per-service rate limit.
        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError | TimeoutError) or exc is None:
            return  # a scraper that went away or timed out: nothing to say
        if self._said.ready("failed"):
            log_event(log, logging.WARNING, "metrics_http_failed", error=error_text(exc))


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
