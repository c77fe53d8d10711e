"""The notifier speaks systemd's notify protocol: we play systemd's side of the socket."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from edge_agent.service.sdnotify import Notifier


def _listener(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(2.0)
    return sock


def test_ready_watchdog_status_and_stopping_reach_the_socket(tmp_path: Path) -> None:
    path = tmp_path / "notify"
    systemd = _listener(path)
    env = {
        "NOTIFY_SOCKET": str(path),
        "WATCHDOG_USEC": "30000000",
        "WATCHDOG_PID": str(os.getpid()),
    }
    notifier = Notifier(env)
    assert notifier.enabled
    assert notifier.watchdog_s == 30.0
    assert notifier.ready("2 pipelines, 29.8 FPS")
    assert systemd.recv(4096).decode().split("\n") == ["READY=1", "STATUS=2 pipelines, 29.8 FPS"]
    assert notifier.watchdog()
    assert systemd.recv(4096) == b"WATCHDOG=1"
    assert notifier.status("line one\nline two")
    assert systemd.recv(4096) == b"STATUS=line one line two"
    assert notifier.stopping()
    assert systemd.recv(4096) == b"STOPPING=1"
    notifier.close()
    systemd.close()


def test_abstract_socket_names_work() -> None:
    name = f"edge-agent-test-{os.getpid()}"
    systemd = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    systemd.bind("\0" + name)
    systemd.settimeout(2.0)
    notifier = Notifier({"NOTIFY_SOCKET": "@" + name})
    assert notifier.ready()
    assert systemd.recv(4096) == b"READY=1"
    notifier.close()
    systemd.close()


def test_outside_systemd_everything_is_a_no_op() -> None:
    notifier = Notifier({})
    assert not notifier.enabled
    assert notifier.watchdog_s is None
    assert not notifier.ready()
    notifier.close()
    assert not notifier.watchdog()


def test_watchdog_for_another_pid_is_not_ours(tmp_path: Path) -> None:
    notifier = Notifier({"WATCHDOG_USEC": "1000000", "WATCHDOG_PID": str(os.getpid() + 1)})
    assert notifier.watchdog_s is None
    notifier.close()


def test_a_vanished_socket_is_not_fatal(tmp_path: Path) -> None:
    path = tmp_path / "notify"
    systemd = _listener(path)
    notifier = Notifier({"NOTIFY_SOCKET": str(path)})
    systemd.close()
    path.unlink()
    assert not notifier.ready()
    notifier.close()
