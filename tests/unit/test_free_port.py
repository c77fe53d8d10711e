"""free_port keeps test servers out of the kernel's ephemeral range.

An outage test stops its broker and starts it again on the same port. A port from the
ephemeral range can meanwhile become the local end of some outgoing connection (the
reconnecting client's own, connecting to itself), and the restart then fails with
"Address already in use": CI lost a run to that.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

import pytest

from edge_agent.comms import local_broker
from edge_agent.comms.local_broker import free_port


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def test_ports_come_from_below_the_ephemeral_range_and_are_free(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Linux's default range, whatever this host's is (a container may set 1024-65535).
    low = 32768
    monkeypatch.setattr(local_broker, "_ephemeral_range", lambda: (low, 60999))
    ports = {free_port() for _ in range(50)}
    assert all(local_broker._LOWEST_PORT <= p < low for p in ports), sorted(ports)
    assert len(ports) > 1, "every call gave the same port"
    assert all(_bindable(p) for p in ports)


def test_a_port_in_use_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", free_port()))
        held.listen()
        taken: int = held.getsockname()[1]
        spare = free_port()
        tries = iter([taken, taken, spare])

        class Scripted(random.Random):
            def randrange(self, start: int, stop: int | None = None, step: int = 1) -> int:
                return next(tries)

        monkeypatch.setattr(local_broker, "_port_picker", Scripted)
        assert free_port() == spare


def test_a_high_ephemeral_range_sends_ports_above_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local_broker, "_ephemeral_range", lambda: (1024, 50000))
    ports = [free_port() for _ in range(20)]
    assert all(50000 < p <= 65535 for p in ports), ports


def test_an_all_ephemeral_port_space_falls_back_to_the_kernels_pick(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(local_broker, "_ephemeral_range", lambda: (1024, 65535))
    assert _bindable(free_port())


def test_an_unreadable_range_assumes_linuxs_default(tmp_path: Path) -> None:
    assert local_broker._ephemeral_range(tmp_path / "missing") == (32768, 60999)
    (tmp_path / "garbled").write_text("32768\n")
    assert local_broker._ephemeral_range(tmp_path / "garbled") == (32768, 60999)
    (tmp_path / "set").write_text("40000\t50000\n")
    assert local_broker._ephemeral_range(tmp_path / "set") == (40000, 50000)
