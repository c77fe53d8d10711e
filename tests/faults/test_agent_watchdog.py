"""The agent under systemd's watchdog, and while it restores its pipelines at start.

An overloaded box (more cameras than its cores take) showed each of these: a pipeline
that was starting read as a dead one and had the watchdog ping withheld, with pings at
half of WatchdogSec a single withheld one let systemd kill the agent, a clean stop logged
an ERROR, and commands went unanswered for as long as the restore took, though the birth
already said online.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import statistics
import threading
import time
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from edge_agent.agent.pipelines import Pipelines
from edge_agent.agent.records import AgentRecords
from edge_agent.agent.roster import Roster, Running
from edge_agent.agent.specs import parse_spec
from edge_agent.agent.ticks import Ticker
from edge_agent.comms.local_broker import LocalBroker
from tests.agent_kit import InProcessAgent, Watcher, photo_pipelines, write_config
from tests.integration.mjpeg_server import free_port


def test_commands_are_answered_while_the_pipelines_restore(
    broker: LocalBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 20 recorded cameras took 15.8 s to restore on a 2-core box, and the pump that sends
    # answers only started after it: a ping sent at the birth was answered 15.9 s later.
    restoring, release = threading.Event(), threading.Event()

    def slow(self: Pipelines) -> list[str]:
        restoring.set()
        release.wait(30.0)
        return []

    monkeypatch.setattr(Pipelines, "restore", slow)
    config = write_config(tmp_path / "agent.toml", port=broker.port, state=tmp_path / "state")
    watcher = Watcher(broker.port, "dev-1")
    agent = InProcessAgent(config)
    try:
        assert restoring.wait(20.0)
        watcher.wait_state(lambda s: s["online"])
        started = time.monotonic()
        assert watcher.ok("ping", timeout=10.0)["pong"] is True
        assert time.monotonic() - started < 5.0
        assert not release.is_set()  # still restoring
    finally:
        release.set()
        watcher.close()
        agent.close()


def _systemd(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(0.2)
    return sock


def test_the_watchdog_is_fed_thrice_an_interval_and_a_clean_stop_withholds_nothing(
    broker: LocalBroker,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from edge_agent.agent.service import AgentService
    from edge_agent.config.agent import load_agent_config
    from tests.agent_kit import cache_dir

    notify = tmp_path / "notify"
    systemd = _systemd(notify)
    env = {
        "EDGE_AGENT_CACHE": str(cache_dir()),
        "NOTIFY_SOCKET": str(notify),
        "WATCHDOG_USEC": "900000",  # 0.9 s: a ping every 0.3 s
        "WATCHDOG_PID": str(os.getpid()),
    }
    config = write_config(tmp_path / "agent.toml", port=broker.port, state=tmp_path / "state")
    service = AgentService(load_agent_config(config, env), env)
    stop = threading.Event()
    thread = threading.Thread(target=service.run, args=(stop,))
    pings: list[float] = []
    with caplog.at_level(logging.WARNING, logger="edge_agent.agent.service"):
        thread.start()
        try:
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline:
                try:
                    datagram = systemd.recv(4096)
                except TimeoutError:
                    continue
                if datagram == b"WATCHDOG=1":
                    pings.append(time.monotonic())
        finally:
            stop.set()
            service.wake()
            thread.join(20.0)
            systemd.close()
        assert not thread.is_alive()
        # Stopped: the pump and the MQTT loop are gone, and that is no reason to withhold.
        assert service._healthy()
    gaps = [b - a for a, b in itertools.pairwise(pings)]
    assert len(gaps) >= 5
    # A third of 0.9 s: at half (0.45 s), one withheld ping left a gap past WatchdogSec.
    assert statistics.median(gaps) < 0.4
    withheld = [r for r in caplog.records if getattr(r, "event", None) == "watchdog_withheld"]
    assert withheld == []


def test_a_receive_thread_stuck_in_a_handler_withholds_the_watchdog(
    broker: LocalBroker,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Alive is not well: a handler blocked (a command on a hung state disk) left the thread
    # alive, every ping went on, and systemd never restarted an agent that answered nothing.
    from edge_agent.agent import service as service_module
    from edge_agent.comms.session import connect
    from edge_agent.comms.settings import BrokerSettings
    from edge_agent.config.agent import load_agent_config
    from tests.agent_kit import cache_dir

    # Over the 1 s an idle thread may take between two signs of life, by a margin.
    monkeypatch.setattr(service_module, "THREAD_STALE_S", 2.5)
    notify = tmp_path / "notify"
    systemd = _systemd(notify)
    env = {
        "EDGE_AGENT_CACHE": str(cache_dir()),
        "NOTIFY_SOCKET": str(notify),
        "WATCHDOG_USEC": "600000",  # a ping every 0.2 s
        "WATCHDOG_PID": str(os.getpid()),
    }
    config = write_config(tmp_path / "agent.toml", port=broker.port, state=tmp_path / "state")
    service = service_module.AgentService(load_agent_config(config, env), env)
    stop = threading.Event()
    thread = threading.Thread(target=service.run, args=(stop,))
    wedged, release = threading.Event(), threading.Event()

    def hung(_message: object) -> None:
        wedged.set()
        release.wait(30.0)

    def pings_within(seconds: float) -> int:
        count, deadline = 0, time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                count += systemd.recv(4096) == b"WATCHDOG=1"
            except TimeoutError:
                continue
        return count

    sender = connect(BrokerSettings(port=broker.port))
    with caplog.at_level(logging.ERROR, logger="edge_agent.agent.service"):
        thread.start()
        try:
            assert pings_within(1.0) >= 2
            service.session.subscribe("wedge/now", hung)
            time.sleep(0.5)  # the subscription is on the broker
            sender.publish("wedge/now", b"", qos=1)
            assert wedged.wait(10.0)
            pings_within(3.0)  # past THREAD_STALE_S
            assert pings_within(1.0) == 0
            release.set()
            assert pings_within(1.0) >= 2  # and back once it moves again
        finally:
            release.set()
            sender.stop()
            stop.set()
            service.wake()
            thread.join(20.0)
            systemd.close()
    assert not thread.is_alive()
    withheld = [r for r in caplog.records if getattr(r, "event", None) == "watchdog_withheld"]
    assert withheld
    assert {r.fields["threads"] for r in withheld} == {"mqtt-rx"}  # type: ignore[attr-defined]


def test_a_pipeline_whose_thread_is_not_yet_started_is_not_stale(tmp_path: Path) -> None:
    # `_launch` marks it running and then starts its thread, which on a busy box takes a
    # while: read as a dead thread meanwhile, it had the watchdog withheld.
    roster = Roster(AgentRecords(tmp_path), max_running=4)
    ticker = Ticker(roster, pool=None)  # type: ignore[arg-type]  # stale() reads no model
    spec = parse_spec(
        {
            "id": "cam1",
            "model": {"name": "person-ssdlite"},
            "source": {"type": "stream", "url": "rtsp://cam1/"},
        }
    )
    starting = Running(spec, status="running")
    roster.running["cam1"] = starting
    assert ticker.stale(60.0) == []
    # Once started, a thread that died is stale, as before.
    starting.thread = threading.Thread(target=lambda: None)
    starting.thread.start()
    starting.thread.join()
    assert ticker.stale(60.0) == ["cam1"]


def test_a_retry_that_is_starting_is_not_stale(
    tmp_path: Path,
    cache_dir: Path,
    astronaut: npt.NDArray[np.uint8],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A camera's retry builds a new run on the same entry, which kept its last run's thread,
    # dead, until the new one was started: in between, the retry read as a wedged pipeline.
    pipelines, _ = photo_pipelines(tmp_path, cache_dir, astronaut, lambda event: None)
    seen: list[list[str]] = []

    class Watched(threading.Thread):
        def start(self) -> None:
            if self.name.startswith("pipeline-"):
                seen.append(pipelines.stale(60.0))  # what the watchdog would see now
            super().start()

    monkeypatch.setattr(threading, "Thread", Watched)
    spec = {
        "id": "door",
        "model": {"name": "face-blazeface"},
        "source": {
            "type": "stream",
            "url": f"http://127.0.0.1:{free_port()}/cam",  # nothing listens: it gives up
            "give_up_after_s": 0.3,
            "stall_timeout_s": 0.3,
            "reconnect_min_s": 0.05,
            "reconnect_max_s": 0.1,
        },
    }
    try:
        pipelines.start(spec, persist=False)
        deadline = time.monotonic() + 30  # the first retry waits 5 s
        while len(seen) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        pipelines.close()
    assert seen[:2] == [[], []]
