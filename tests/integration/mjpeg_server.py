"""A tiny MJPEG-over-HTTP camera for stream tests: stdlib server, real JPEG frames.

It can be stopped (every open connection is cut, as when a camera reboots),
restarted on the same port, and told to stall (keep connections open but send
nothing, as a wedged camera or a dead NAT mapping does).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import cv2
import numpy as np
import numpy.typing as npt

# One port picker for every test server; see its docstring for why not bind(0).
from edge_agent.comms.local_broker import free_port

__all__ = ["BOUNDARY", "MjpegServer", "free_port"]

BOUNDARY = b"frame"


class MjpegServer:
    """Serves `image` as an endless multipart/x-mixed-replace JPEG stream at `fps`."""

    def __init__(self, image: npt.NDArray[np.uint8], port: int, fps: float = 25.0) -> None:
        ok, encoded = cv2.imencode(".jpg", image)
        assert ok, "cv2.imencode failed on the test image"
        self.jpeg = encoded.tobytes()
        self.port = port
        self.interval = 1.0 / fps
        self.stalled = threading.Event()
        self.frames_per_connection: int | None = None
        """Close each connection after this many frames (a camera at its session limit)."""
        self._stop = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/stream.mjpg"

    def start(self) -> None:
        """Listen on the port (again, after `stop`)."""
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass  # keep test output clean; failures show up as assertions

            def do_GET(self) -> None:
                with owner._lock:
                    owner._connections.add(self.connection)
                try:
                    self.send_response(200)
                    self.send_header(
                        "Content-Type",
                        f"multipart/x-mixed-replace; boundary={BOUNDARY.decode()}",
                    )
                    self.end_headers()
                    owner._serve(self)
                except OSError:
                    pass  # the client went away or stop() cut the socket
                finally:
                    with owner._lock:
                        owner._connections.discard(self.connection)

        self._stop.clear()
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = False
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def _serve(self, handler: BaseHTTPRequestHandler) -> None:
        part = (
            b"--" + BOUNDARY + b"\r\nContent-Type: image/jpeg\r\n"
            b"Content-Length: " + str(len(self.jpeg)).encode() + b"\r\n\r\n" + self.jpeg + b"\r\n"
        )
        sent = 0
        while not self._stop.is_set():
            if self.frames_per_connection is not None and sent >= self.frames_per_connection:
                return  # HTTP/1.0: the connection closes with the handler
            if not self.stalled.is_set():
                handler.wfile.write(part)
                handler.wfile.flush()
                sent += 1
            time.sleep(self.interval)

    def stop(self) -> None:
        """Stop listening and cut every open connection; safe to call twice."""
        server, self._server = self._server, None
        if server is None:
            return
        self._stop.set()
        server.shutdown()
        with self._lock:
            for conn in self._connections:
                # The peer may have closed it already.
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
        # Joins the handler threads, which see _stop and return.
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
