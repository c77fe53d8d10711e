"""A private mosquitto on a free loopback port: for tests, benchmarks and the demo.

The broker gets its own config file in a temporary folder (no persistence, a
packet size cap, $SYS every second so its byte counters can be read), and can
be stopped, killed and started again on the same port, which is how the outage
tests take the broker away under a running transfer.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from edge_agent.errors import EdgeAgentError
from edge_agent.procstats import status_bytes

MOSQUITTO_CANDIDATES = ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto")


def find_mosquitto() -> str | None:
    """The mosquitto binary, from PATH or its usual sbin homes; None if not installed."""
    found = shutil.which("mosquitto")
    if found:
        return found
    return next((p for p in MOSQUITTO_CANDIDATES if Path(p).is_file()), None)


# Where free_port looks when the kernel's ephemeral range cannot be read (Linux's default is
# 32768-60999).
_EPHEMERAL_DEFAULT = (32768, 60999)
_PORT_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _ephemeral_range(path: Path = _PORT_RANGE_FILE) -> tuple[int, int]:
    try:
        low, high = path.read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return _EPHEMERAL_DEFAULT


def _port_picker() -> random.Random:
    # A private generator: Hypothesis and tests seed the global one, and two runs seeded
    # alike would try the same ports in the same order.
    return random.Random(os.urandom(16))


# Below this sit the registered ports of services a box may well run.
_LOWEST_PORT = 10000


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now, outside the kernel's ephemeral range.

    A port from bind(("", 0)) is an ephemeral one. While a server on it is down (the outage
    tests restart their broker on the same port), any outgoing connection can be given that
    port as its local end, even the reconnecting client's own (a TCP self-connect), and the
    restarted server then fails with "Address already in use". CI lost a run to exactly that,
    so ports come from below the ephemeral range, where the kernel never hands them out.
    """
    low, high = _ephemeral_range()
    if low - _LOWEST_PORT >= 1000:
        start, stop = _LOWEST_PORT, low
    elif 65535 - high >= 1000:
        start, stop = high + 1, 65536
    else:  # the whole port space is ephemeral: nothing better than the kernel's own pick
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            picked: int = sock.getsockname()[1]
            return picked
    rng = _port_picker()
    for _ in range(500):
        port = rng.randrange(start, stop)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    raise EdgeAgentError(
        f"no free TCP port on {host} between {start} and {stop - 1}",
        "stop what holds the ports, or widen the range",
        code="broker.unreachable",
    )


class LocalBroker:
    """One mosquitto process, restartable on the same port.

    Use as a context manager, or call `start()` and `close()`.
    """

    def __init__(
        self,
        port: int | None = None,
        *,
        host: str = "127.0.0.1",
        max_packet_bytes: int = 1024 * 1024,
        extra_config: str = "",
        folder: Path | None = None,
    ) -> None:
        exe = find_mosquitto()
        if exe is None:
            raise EdgeAgentError(
                "mosquitto is not installed",
                "install it (apt-get install mosquitto) or pass --broker URL",
                code="broker.unreachable",
            )
        self.exe = exe
        self.host = host
        self.port = port if port is not None else free_port(host)
        self._own_folder = folder is None
        self.folder = folder if folder is not None else Path(tempfile.mkdtemp(prefix="mosq-"))
        self.config = self.folder / "mosquitto.conf"
        self.log = self.folder / "mosquitto.log"
        # Started as root, mosquitto drops to the `mosquitto` user, which cannot reach a
        # folder under root's private temp dirs (pytest's are 0700): the log and the
        # persistence database were then silently never written, and a "persistent" broker
        # forgot every session on restart. This broker is ours and listens on loopback only.
        run_as = "user root\n" if os.geteuid() == 0 else ""
        self.config.write_text(
            f"listener {self.port} {host}\n"
            f"{run_as}"
            "allow_anonymous true\n"
            "persistence false\n"
            f"max_packet_size {max_packet_bytes}\n"
            "sys_interval 1\n"
            "set_tcp_nodelay true\n"
            f"log_dest file {self.log}\n"
            "log_type error\nlog_type warning\nlog_type notice\n" + extra_config,
            encoding="utf-8",
        )
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"mqtt://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout: float = 10.0) -> None:
        """Start mosquitto and wait until it accepts connections.

        Raises:
            EdgeAgentError: broker.unreachable if it exits or does not listen in time.
        """
        if self.running:
            return
        self._proc = subprocess.Popen(
            [self.exe, "-c", str(self.config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                break
            with contextlib.suppress(OSError):
                socket.create_connection((self.host, self.port), 0.2).close()
                return
            time.sleep(0.02)
        log = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
        self.stop()
        raise EdgeAgentError(
            f"mosquitto did not start on {self.host}:{self.port}: {log.strip() or 'no log'}",
            "check the port is free and mosquitto runs by hand",
            code="broker.unreachable",
        )

    def stop(self, timeout: float = 5.0) -> None:
        """Stop it gracefully (SIGTERM), then SIGKILL if it does not go in time."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)

    def kill(self) -> None:
        """Take the broker away the hard way: clients see a dropped TCP connection."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(5.0)

    def freeze(self) -> None:
        """Take the broker away as a dead link does: SIGSTOP. Its sockets stay open, so a
        client sees no error at all, only silence, until its keepalive runs out; the kernel
        still completes new TCP handshakes into the listen backlog, and nothing answers them."""
        if self._proc is not None and self._proc.poll() is None:
            os.kill(self._proc.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        """Bring a frozen broker back (SIGCONT): it then reads everything queued meanwhile."""
        if self._proc is not None and self._proc.poll() is None:
            os.kill(self._proc.pid, signal.SIGCONT)

    def restart(self, down_for: float = 0.0) -> None:
        """Kill, stay down for `down_for` seconds, and start again on the same port."""
        self.kill()
        time.sleep(down_for)
        self.start()

    def rss_bytes(self) -> int:
        """The broker's resident memory now (Linux /proc), 0 if not running."""
        if self._proc is None:
            return 0
        return status_bytes(self._proc.pid).get("VmRSS", 0)

    def close(self) -> None:
        self.stop()
        if self._own_folder:
            shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> LocalBroker:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
