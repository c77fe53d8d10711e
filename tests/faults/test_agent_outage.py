"""The broker goes away for 30 s while a pipeline runs: nothing is lost and order is kept.

The agent (a real process) runs person-ssdlite on the walk video with the `all`
results policy, so every frame makes exactly one result and the count is known.
The broker is stopped as the first result arrives and started again 30 s later on
the same port; it keeps sessions on disk, so the watcher's persistent session
collects what the agent publishes after it is back, whoever reconnects first.
"""

from __future__ import annotations

import itertools
import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from edge_agent.clips import WalkVideo, write_walk
from edge_agent.comms.local_broker import LocalBroker
from edge_agent.comms.session import MqttSession, connect
from edge_agent.comms.settings import BrokerSettings
from edge_agent.outbox import Outbox, Priority
from tests.agent_kit import PREFIX, AgentProcess, InProcessAgent, Watcher, write_config

DEVICE = "outage-dev"
OUTAGE_S = float(os.environ.get("EDGE_AGENT_TEST_OUTAGE_S", "12"))
"""12 s in the suite; `EDGE_AGENT_TEST_OUTAGE_S=30` runs the 30 s the issue names. The
agent's reconnect backoff is capped at 1 s here, so the length only adds buffered results
and telemetry, not behaviour (tools/soak_agent.py holds outages of any length), and the
30 s cost 18 s of the suite's 15 minutes."""
BACKLOG = 20_000
"""Results an outage left: enough that draining them takes a while, even on loopback."""


@pytest.fixture
def persistent_broker(tmp_path: Path) -> Iterator[LocalBroker]:
    folder = tmp_path / "mosquitto"
    folder.mkdir()
    with LocalBroker(
        folder=folder, extra_config=f"persistence true\npersistence_location {folder}/\n"
    ) as broker:
        yield broker


def test_results_and_telemetry_made_while_the_broker_is_down_arrive_in_order(
    persistent_broker: LocalBroker, tmp_path: Path
) -> None:
    broker = persistent_broker
    # Long enough that most frames are made while the broker is away on any box: a file
    # plays as fast as the box runs (about 200 FPS on a bf16 CPU, 50 on an AVX2 one).
    walk: WalkVideo = write_walk(tmp_path / "walk.avi", empty=10, crossing=20, frames=600)
    watcher = Watcher(broker.port, DEVICE, client_id="console-1")
    config = write_config(
        tmp_path / "agent.toml",
        port=broker.port,
        device=DEVICE,
        state=tmp_path / "state",
        results="all",
        telemetry_s=1.0,
    )
    agent = AgentProcess(config, tmp_path / "agent.log").start()
    try:
        watcher.wait_state(lambda s: s["online"], timeout=60)
        spec = {
            "id": "cam",
            "model": {"name": "person-ssdlite"},
            "source": {"type": "file", "path": str(walk.path)},
        }
        watcher.send("start_pipeline", {"spec": spec})
        watcher.wait(lambda m: m.leaf == "results/cam", timeout=60, what="a first result")
        broker.stop()
        down = time.time()
        # The watcher's session is on disk, so what the agent sends after the restart
        # reaches it even if the agent reconnects first. (Once the database was silently
        # never written, and the test lost that race now and then.)
        assert (broker.folder / "mosquitto.db").is_file(), "the broker kept no sessions"
        time.sleep(OUTAGE_S)
        broker.start()
        up = time.time()

        watcher.wait_event(
            lambda e: e["kind"] == "pipeline_stopped" and e["pipeline"] == "cam",
            timeout=60,
            what="the end of the video",
        )
        watcher.wait(
            lambda m: m.leaf == "results/cam" and m.json()["frame"] == walk.frames - 1,
            timeout=30,
            what="the last frame's result",
        )

        # Every frame exactly once after QoS 1 duplicates are set aside, in order.
        seen: dict[int, dict[str, object]] = {}
        for message in watcher.on("results/cam"):
            result = message.json()
            seen.setdefault(result["frame"], result)
        assert list(seen) == list(range(walk.frames))
        # Made while the broker was away, delivered after, with the time they were made.
        buffered = [r for r in seen.values() if down < float(r["ts"]) < up]  # type: ignore[arg-type]
        assert len(buffered) >= 10, f"only {len(buffered)} frames ran during the outage"
        stamps = [float(r["ts"]) for r in seen.values()]  # type: ignore[arg-type]
        assert stamps == sorted(stamps)

        # Telemetry kept its 1 s pace through the outage, each message with its own time.
        status = watcher.ok("get_status")
        assert status["reconnects"] >= 1
        assert status["outbox"]["dropped_result"] == 0
        assert status["outbox"]["dropped_critical"] == 0
        times = list(dict.fromkeys(m.json()["ts"] for m in watcher.on("telemetry")))
        # In order, but for the newest waiting at the reconnect (or made while the backlog
        # drained): it goes ahead of the backlog, so the console's figures are current at
        # once. Nothing else overtakes: the rest is the outage's history.
        ahead = [i for i, t in enumerate(times) if any(later < t for later in times[i + 1 :])]
        assert all(times[i] > max(times[:i], default=0.0) for i in ahead), times
        during = [t for t in times if down < t < up]
        assert len(during) >= OUTAGE_S * 0.8, f"{len(during)} telemetry messages in the outage"
        # Every interval is there: judged in the order they were made, since those sent
        # ahead (allowed above) arrive before the history (gaps of +29 s, -28 s in arrival
        # order failed this now and then, with nothing missing).
        gaps = [b - a for a, b in itertools.pairwise(sorted(times))]
        assert max(gaps) < 3.0, "a telemetry interval went missing"
        # The detection events the video made survived too, each object new ... end.
        detections = [e for e in watcher.events() if e["kind"] == "detection"]
        assert detections
        assert detections[-1]["type"] == "end"
        assert agent.stop() == 0, agent.tail()
    finally:
        agent.close()
        watcher.close()
    stopped = json.loads(watcher.on("state")[-1].payload)
    assert stopped["online"] is False


def _back_from_an_outage(
    broker: LocalBroker, tmp_path: Path, results: int, events_every: int = 0
) -> tuple[list[str], MqttSession, Watcher, InProcessAgent]:
    """An agent started on an outbox an outage filled with `results` (and an event every
    `events_every`), and one stream of everything it sends: the last topic level of each
    message, in the broker's order. At QoS 0, so the broker's queue for a QoS 1 subscriber
    does not drop part of the burst."""
    state = tmp_path / "state"
    backlog = Outbox(state / "outbox.sqlite")
    for frame in range(results):
        payload = json.dumps({"frame": frame}).encode()
        backlog.put(f"{PREFIX}/dev-1/results/cam", payload, Priority.RESULT)
        if events_every and frame % events_every == 0:
            backlog.put(f"{PREFIX}/dev-1/events", payload, Priority.CRITICAL)
    backlog.close()
    seen: list[str] = []
    stream = connect(BrokerSettings(port=broker.port))
    stream.subscribe(f"{PREFIX}/dev-1/#", lambda m: seen.append(m.topic.rsplit("/", 1)[-1]), qos=0)
    watcher = Watcher(broker.port, "dev-1")
    config = write_config(tmp_path / "agent.toml", port=broker.port, state=state)
    return seen, stream, watcher, InProcessAgent(config=config)


def test_an_answer_goes_ahead_of_the_backlog_an_outage_left(
    broker: LocalBroker, tmp_path: Path
) -> None:
    # A box back from an outage holds up to its quota of results (190,000 at 64 MB) and
    # drains them at the broker's pace; an answer queued behind them all kept the console
    # waiting past its timeout for a command the box had already run.
    # A day's events are critical too, and come before the answer.
    seen, stream, watcher, agent = _back_from_an_outage(broker, tmp_path, BACKLOG, events_every=40)
    try:
        watcher.wait_state(lambda s: s["online"], timeout=30)
        ping = watcher.send("ping")
        watcher.final(ping)
        deadline = time.monotonic() + 60
        while seen.count("cam") < BACKLOG and time.monotonic() < deadline:
            time.sleep(0.1)
        assert seen.count("cam") == BACKLOG  # the backlog still arrives whole
        answered = seen.index("resp")
        assert seen[:answered].count("cam") < BACKLOG // 10, f"{answered} messages came first"
    finally:
        watcher.close()
        stream.stop()
        agent.close()


def test_an_answer_sent_ahead_is_sent_once_while_the_disk_refuses_its_ack(
    broker: LocalBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An answer goes ahead of the backlog; its row is deleted when the broker acks it. A
    # disk that refuses that delete leaves the row, and the pump, looking for answers
    # ahead of where it is in the backlog, found it again every round and sent it again.
    seen, stream, watcher, agent = _back_from_an_outage(broker, tmp_path, 2_000)
    outbox = agent.service.outbox
    acks = outbox.ack
    refused: list[list[int]] = []

    # sqlite itself refuses the ack's delete, on the acking thread only. A connection-wide
    # `PRAGMA query_only`, switched on and off around each ack, also refused whatever
    # another thread wrote in between: now and then the answer's own row, which then never
    # was on the disk for the test to find (one CI run in many).
    acking: set[int] = set()

    def refuse_deletes(action: int, *_: object) -> int:
        if action == sqlite3.SQLITE_DELETE and threading.get_ident() in acking:
            return sqlite3.SQLITE_DENY
        return sqlite3.SQLITE_OK

    def ack_on_a_read_only_disk(seqs: list[int]) -> None:
        acking.add(threading.get_ident())
        try:
            acks(seqs)
            refused.append(seqs)
        finally:
            acking.discard(threading.get_ident())

    try:
        watcher.wait_state(lambda s: s["online"], timeout=30)
        with outbox._lock:
            outbox._db.set_authorizer(refuse_deletes)
        monkeypatch.setattr(outbox, "ack", ack_on_a_read_only_disk)
        ping = watcher.send("ping")
        watcher.final(ping)
        deadline = time.monotonic() + 60
        while seen.count("cam") < 2_000 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert seen.count("cam") == 2_000
        assert len(refused) > 2  # the answer's row stayed through several rounds
        assert outbox.peek_answers(10), "the disk kept the answer's row"
        time.sleep(0.5)  # a round or two more, in which it must not go again
        assert seen.count("resp") == 1
    finally:
        watcher.close()
        stream.stop()
        agent.close()
