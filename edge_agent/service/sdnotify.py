"""sd_notify over its datagram socket, with no dependency.

systemd hands a `Type=notify` service the socket in `$NOTIFY_SOCKET`: a path,
or an abstract name when it starts with '@'. Each message is one datagram of
newline-separated `KEY=value` assignments (READY=1, WATCHDOG=1, STATUS=...,
STOPPING=1). Outside systemd the variable is absent and every call is a cheap
no-op, so the same agent runs under a terminal, a test or a unit.

The watchdog interval comes from `$WATCHDOG_USEC` (and `$WATCHDOG_PID`, which
must be ours when set); the service pings at a third of it, and only while its
own health checks pass (see agent.service), so a wedged loop gets restarted.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping


class Notifier:
    """Sends sd_notify messages; does nothing when not run by systemd.

    Args:
        env: The environment to read NOTIFY_SOCKET/WATCHDOG_* from (os.environ in the service).
    """

    def __init__(self, env: Mapping[str, str]) -> None:
        address = env.get("NOTIFY_SOCKET", "")
        self._address: str | None = None
        if address.startswith("@"):
            self._address = "\0" + address[1:]
        elif address.startswith("/"):
            self._address = address
        self._sock: socket.socket | None = None
        if self._address is not None:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        mine = not pid or pid == str(os.getpid())
        self.watchdog_s: float | None = int(usec) / 1e6 if usec.isdigit() and mine else None

    @property
    def enabled(self) -> bool:
        """True when systemd is listening."""
        return self._sock is not None

    def send(self, **fields: str) -> bool:
        """Send one datagram of KEY=value lines; True if it was sent."""
        if self._sock is None or self._address is None:
            return False
        # Newlines inside a value would start a new assignment: flatten them.
        text = "\n".join(f"{k}={str(v).replace(chr(10), ' ')}" for k, v in fields.items())
        try:
            self._sock.sendto(text.encode(), self._address)
        except OSError:
            # systemd gone (shutdown) or the socket is full: never fatal for the agent.
            return False
        return True

    def ready(self, status: str = "") -> bool:
        """READY=1, with an optional STATUS."""
        return self.send(READY="1", **({"STATUS": status} if status else {}))

    def watchdog(self) -> bool:
        """WATCHDOG=1: the service is alive and well."""
        return self.send(WATCHDOG="1")

    def status(self, text: str) -> bool:
        """STATUS=text, shown by `systemctl status`."""
        return self.send(STATUS=text)

    def stopping(self) -> bool:
        """STOPPING=1: a clean stop has begun."""
        return self.send(STOPPING="1")

    def close(self) -> None:
        """Close the socket; safe to call twice."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
