"""`edge-agent demo` end to end, as `make demo` runs it, against the suite's mosquitto.

The real command in its own process: a fleet signs and publishes person-ssdlite, the
agent deploys it over MQTT and runs a pipeline on the walk video, and the demo ends by
itself with a summary when the video ends, or on Ctrl-C with exit 130.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from edge_agent.comms.local_broker import LocalBroker
from edge_agent.demo.brokers import EmbeddedAmqtt, choose_broker
from edge_agent.demo.run import FLEET_INSTANCE, Demo, DemoOptions
from edge_agent.paths import Layout
from edge_agent.protocol.topics import Topics
from tests.integration.test_fleet_console import mosquitto_pub
from tests.retained_kit import until

TIMEOUT_S = 90.0


def _command(broker: LocalBroker, frames: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "edge_agent",
        "demo",
        "--broker",
        broker.url,
        "--frames",
        str(frames),
    ]


def _summary(stdout: str) -> dict[str, Any]:
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1, stdout
    summary: dict[str, Any] = json.loads(lines[0])["summary"]
    return summary


def test_demo_runs_to_the_end_of_the_video_and_summarises(
    broker: LocalBroker, tmp_path: Path
) -> None:
    env = {**os.environ, "EDGE_AGENT_STATE_DIR": str(tmp_path / "unused-state")}
    done = subprocess.run(
        _command(broker, 45),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = _summary(done.stdout)
    assert summary["broker"] == "url"
    assert summary["mqtt_version"] == "5"
    assert summary["model"] == "person-ssdlite"
    assert summary["model_version"] == 1
    assert summary["interrupted"] is False
    # results = all: one message per frame, every frame of the video, none lost.
    assert summary["results"] == summary["video_frames"] == 45
    assert summary["frames_with_person"] > 0
    kinds = summary["event_kinds"]
    assert kinds.get("model_activated") == 1
    assert kinds.get("pipeline_started") == 1
    assert kinds.get("pipeline_stopped") == 1
    assert kinds.get("rule", 0) >= 1  # the person appeared
    assert summary["fps"] > 0
    # Where it ran is printed, from what the agent itself reports.
    assert summary["device"], done.stderr[-3000:]
    assert summary["precision"]
    assert "start_pipeline walk: person-ssdlite on " in done.stderr
    assert "edge-agent demo: summary" in done.stderr
    # Results went to MQTT, not to the demo's stdout: stdout is the summary line alone.
    assert done.stdout.count("\n") == 1


def test_demo_on_the_embedded_broker_runs_on_mqtt_3_1_1() -> None:
    """Where no mosquitto can be installed: amqtt in-process, every session on 3.1.1."""
    command = [sys.executable, "-m", "edge_agent", "demo", "--embedded-broker", "--frames", "30"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = _summary(done.stdout)
    assert (summary["broker"], summary["mqtt_version"]) == ("amqtt", "3.1.1")
    assert summary["results"] == 30
    assert summary["event_kinds"].get("pipeline_stopped") == 1
    assert "amqtt speaks only 3.1.1" in done.stderr


def test_ctrl_c_stops_the_demo_with_a_summary_and_exit_130(broker: LocalBroker) -> None:
    # A video long enough that the pipeline still runs when the signal comes, a second after
    # it started (600 frames take 4 s at this box's 150 FPS), and no longer: the demo builds
    # it first, 3,000 frames took 8 s.
    child = subprocess.Popen(
        _command(broker, 600),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    stderr: list[str] = []
    running = threading.Event()

    def read_stderr() -> None:
        assert child.stderr is not None
        for line in child.stderr:
            stderr.append(line)
            if "start_pipeline walk" in line:
                running.set()

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    try:
        assert running.wait(TIMEOUT_S), "".join(stderr)[-3000:]
        time.sleep(1.0)
        stopped_at = time.monotonic()
        child.send_signal(signal.SIGINT)
        stdout, _ = child.communicate(timeout=30.0)
        took = time.monotonic() - stopped_at
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    reader.join(5.0)
    assert child.returncode == 130, "".join(stderr)[-3000:]
    assert took < 15.0
    summary = _summary(stdout)
    assert summary["interrupted"] is True
    assert 0 < summary["results"] < summary["video_frames"] == 600
    assert "Traceback" not in "".join(stderr)


def test_the_embedded_broker_stops_at_once_and_cleanly(caplog: pytest.LogCaptureFixture) -> None:
    # amqtt's broadcast loop waits on a future Broker() makes on the current thread's loop.
    # Made on the caller's thread, it never woke: every demo on the embedded broker ended
    # with amqtt's 5 s shutdown timeout, and a traceback in its log, after the summary was due.
    broker = EmbeddedAmqtt()
    broker.start()
    with caplog.at_level(logging.INFO, logger="amqtt"):
        broker.close()
    # The listener is closed with it.
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((broker.host, broker.port), timeout=2.0).close()
    assert "Broker closed" in caplog.text
    assert "Failed to cleanly shutdown" not in caplog.text
    assert "Traceback" not in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


def _retained(broker: LocalBroker, topic: str) -> bool:
    """Whether the broker holds a retained message on `topic`, as mosquitto_sub reads it."""
    done = subprocess.run(
        ["mosquitto_sub", "-p", str(broker.port), "-t", topic, "--retained-only",
         "-C", "1", "-W", "1"],
        capture_output=True, timeout=30, check=False,
    )  # fmt: skip
    return done.returncode == 0 and bool(done.stdout)


def test_the_demos_fleet_server_announces_again_and_rechecks_its_peers_after_a_reconnect(
    broker: LocalBroker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Its session was connected without `on_connected`, as `serve`'s is not: after a broker
    # restart mid-demo (this one keeps nothing) its presence was gone for good, so no
    # server counted it as its releases' broadcaster, and a peer gone meanwhile was
    # counted by it for good.
    topics = Topics()
    peer = {"instance": "peer-1", "started_at": time.time()}
    mosquitto_pub(broker, topics.server("peer-1"), peer, retain=True)
    layout = Layout(cache=tmp_path / "cache", state=tmp_path / "state")
    demo = Demo(DemoOptions(broker=broker.url), layout, Console(file=io.StringIO()))
    caplog.set_level(logging.INFO, logger="edge_agent.fleet.server")
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, demo._work, ignore_errors=True)
        demo._fleet(choose_broker(broker.url, "5"), stack)
        presence = topics.server(FLEET_INSTANCE)
        until(lambda: _retained(broker, presence))
        broker.restart()
        until(lambda: _retained(broker, presence))
        until(lambda: any(r.getMessage() == "fleet_peer_gone" for r in caplog.records))
    gone = [r for r in caplog.records if r.getMessage() == "fleet_peer_gone"]
    assert [r.fields["peers"] for r in gone] == ["peer-1"], gone  # type: ignore[attr-defined]
