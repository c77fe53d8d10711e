"""A state disk that refuses writes, or holds a damaged file, leaves the agent serving.

Both used to end the agent: the outbox raised out of the main loop at the next telemetry
tick (a full disk), and one unreadable file in the model store raised out of the
birth message, so the box showed offline and the next state change killed the loop. Under
systemd each restart met the same disk, and after ten the unit stayed down. The agent runs
on a thread over a real mosquitto; the disk's refusal is sqlite's own (query_only makes
every write fail as a read-only or full disk does) and the damaged file is a real one.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from edge_agent.comms.local_broker import LocalBroker
from edge_agent.outbox import Outbox, Priority
from edge_agent.paths import Layout
from edge_agent.store.store import ModelStore
from tests.agent_kit import InProcessAgent, Watcher, write_config

DEVICE = "disk-dev"


@pytest.fixture
def watcher(broker: LocalBroker) -> Iterator[Watcher]:
    running = Watcher(broker.port, DEVICE)
    yield running
    running.close()


def test_an_outbox_the_disk_refuses_keeps_answers_and_the_loop_going(
    broker: LocalBroker, tmp_path: Path, watcher: Watcher
) -> None:
    config = write_config(
        tmp_path / "agent.toml", port=broker.port, device=DEVICE, state=tmp_path / "state"
    )
    agent = InProcessAgent(config)
    try:
        watcher.wait_state(lambda s: s["online"])
        watcher.wait(lambda m: m.leaf == "telemetry", what="telemetry")
        outbox = agent.service.outbox
        with outbox._lock:
            outbox._db.execute("PRAGMA query_only = ON")
        # An answer still reaches the console, straight from the agent.
        assert watcher.ok("ping")["pong"] is True
        # Telemetry ticks go on, refused and counted, and the loop lives through them.
        deadline = time.monotonic() + 15
        while outbox.stats().dropped_telemetry < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert outbox.stats().dropped_telemetry >= 2
        assert agent.thread.is_alive()
        assert agent.service._healthy()
        # The disk is back: telemetry flows through the outbox again.
        with outbox._lock:
            outbox._db.execute("PRAGMA query_only = OFF")
        seen = len(watcher.on("telemetry"))
        watcher.wait(
            lambda m: m.leaf == "telemetry" and len(watcher.on("telemetry")) > seen + 1,
            what="telemetry after the disk came back",
        )
    finally:
        agent.close()


def test_a_damaged_store_file_still_lets_the_box_come_online(
    broker: LocalBroker, tmp_path: Path, watcher: Watcher, caplog: pytest.LogCaptureFixture
) -> None:
    state = tmp_path / "state"
    damaged = Layout(cache=tmp_path / "cache", state=state).store / "models" / "dock"
    (damaged / "versions" / "1").mkdir(parents=True)
    (damaged / "state.json").write_text('{"current": 1, "prev')  # cut off mid-write
    (damaged / "versions" / "1" / "release.json").write_text('{"release": {"na')
    config = write_config(tmp_path / "agent.toml", port=broker.port, device=DEVICE, state=state)
    agent = InProcessAgent(config)
    try:
        birth = watcher.wait_state(lambda s: s["online"])
        # Everything that does read is there: the reference models, at least.
        assert {m["name"] for m in birth["models"]} >= {"person-ssdlite", "face-blazeface"}
        assert "dock" not in {m["name"] for m in birth["models"]}
        assert watcher.ok("ping")["pong"] is True
        # The main loop published state after the pipelines were restored, and lives on.
        time.sleep(1.0)
        assert agent.thread.is_alive()
        # The state file was set aside and rebuilt as the store was first read; the
        # release has nothing to rebuild it from, and the store names it when asked.
        assert len(list(damaged.glob("state.json.damaged-*"))) == 1
        # The listing names it beside everything that reads (it answered store.corrupt,
        # every other model hidden from the operator sent to look).
        listed = watcher.ok("list_models")
        assert "dock" not in {m["name"] for m in listed["installed"]}
        assert "person-ssdlite" in listed["reference"]
        [said_damaged] = listed["damaged"]
        assert said_damaged.startswith("dock v1")
        assert "release.json" in said_damaged
        # And verify names it, rather than stopping at it.
        problems = ModelStore(Layout(cache=tmp_path / "cache", state=state)).verify()
        assert [p.where for p in problems] == ["dock v1"]
        # Said once, though every state message reads the store again: a file that stays
        # damaged must not fill the journal. (A stale will makes the agent publish again.)
        births = len([m for m in watcher.on("state") if m.json()["online"]])
        stale = json.dumps({"online": False, "seq": 0, "ts": time.time()}).encode()
        watcher.session.publish(f"edge/v1/{DEVICE}/state", stale, qos=1)
        watcher.wait(
            lambda m: (
                m.leaf == "state"
                and m.json()["online"]
                and len([x for x in watcher.on("state") if x.json()["online"]]) > births
            ),
            timeout=30,
            what="a birth answering the stale will",
        )
        said = [r for r in caplog.records if "store_damaged" in r.getMessage()]
        assert len(said) == 1, [r.getMessage() for r in said]
        # What cannot be read can still be removed: it answered store.corrupt.
        watcher.ok("remove_model", {"name": "dock", "version": 1})
        assert not (damaged / "versions" / "1").exists()
        assert "damaged" not in watcher.ok("list_models")
    finally:
        agent.close()


def test_damaged_sqlite_files_are_set_aside_and_the_agent_starts(
    broker: LocalBroker, tmp_path: Path
) -> None:
    # Another program's file at the command log's path, and an outbox whose pages were
    # damaged after it was written (a bad sector): each raised out of the start, and
    # systemd restarted the agent into the same error until its start limit.
    state = tmp_path / "state"
    agent_dir = state / "agent"
    agent_dir.mkdir(parents=True)
    (agent_dir / "commands.sqlite").write_bytes(b"not a database, " * 512)
    outbox = Outbox(state / "outbox.sqlite")
    for i in range(3000):
        outbox.put("edge/v1/x/results/cam", b"r" * 200 + str(i).encode(), Priority.RESULT)
    outbox.close()
    with (state / "outbox.sqlite").open("r+b") as damaged:
        damaged.seek(8 * 4096)
        damaged.write(b"\xff" * 4096 * 4)
    config = write_config(tmp_path / "agent.toml", port=broker.port, state=state)
    watcher = Watcher(broker.port, "dev-1")
    agent = InProcessAgent(config)
    try:
        watcher.wait_state(lambda s: s["online"], timeout=30)
        assert watcher.ok("ping")["pong"] is True
        assert watcher.ok("get_status")["outbox"]["depth"] == 0
        assert [p.name.split(".damaged-")[0] for p in agent_dir.glob("*.damaged-*")] == [
            "commands.sqlite"
        ]
        assert len(list(state.glob("outbox.sqlite.damaged-*"))) == 1
    finally:
        watcher.close()
        agent.close()


def test_a_record_a_newer_agent_wrote_restores_what_this_one_knows(
    broker: LocalBroker, tmp_path: Path, camera: str
) -> None:
    # A downgrade: agent.json has a field this version does not know at its top, and a
    # pipeline spec has one in its source and in a sink. The whole record was set aside
    # (pipelines and telemetry interval lost) or every restore failed on the extras.
    state = tmp_path / "state"
    (state / "agent").mkdir(parents=True)
    spec = {
        "id": "gate",
        "model": {"name": "text-orientation"},
        "source": {"type": "stream", "url": camera, "newer_source_option": True},
        "sinks": [{"type": "jsonl", "path": str(state / "out.jsonl"), "rotate": "daily"}],
        "newer_pipeline_option": 3,
    }
    record = {"seq": 5, "telemetry_interval_s": 2.0, "pipelines": {"gate": spec},
              "newer_record_field": {"x": 1}}  # fmt: skip
    (state / "agent" / "agent.json").write_text(json.dumps(record))
    config = write_config(tmp_path / "agent.toml", port=broker.port, state=state)
    watcher = Watcher(broker.port, "dev-1")
    agent = InProcessAgent(config)
    try:
        born = watcher.wait_state(
            lambda s: [(p["id"], p["status"]) for p in s["pipelines"]] == [("gate", "running")],
            timeout=60,
        )
        assert born["seq"] > 5
        assert watcher.ok("get_status")["telemetry_interval_s"] == 2.0
        assert not list((state / "agent").glob("agent.damaged-*"))
        deadline = time.monotonic() + 30
        out = state / "out.jsonl"
        while not (out.exists() and out.stat().st_size) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert out.stat().st_size > 0  # the sink the record named runs
    finally:
        watcher.close()
        agent.close()


def test_while_the_disk_refuses_the_outbox_results_and_telemetry_go_straight_out(
    broker: LocalBroker, tmp_path: Path, watcher: Watcher, camera: str
) -> None:
    # Only answers and events went to the broker directly: a box whose state disk filled
    # went dark to its console, results and telemetry dropped, while its link was up.
    config = write_config(
        tmp_path / "agent.toml", port=broker.port, device=DEVICE, state=tmp_path / "state"
    )
    agent = InProcessAgent(config)
    try:
        watcher.wait_state(lambda s: s["online"])
        spec = {"id": "cam", "model": {"name": "face-blazeface"},
                "source": {"type": "stream", "url": camera}}  # fmt: skip
        watcher.ok("start_pipeline", {"spec": spec}, timeout=60)
        watcher.wait(lambda m: m.leaf == "results/cam", what="a result")
        outbox = agent.service.outbox
        with outbox._lock:
            outbox._db.execute("PRAGMA query_only = ON")
        deadline = time.monotonic() + 10
        while not outbox.refusing and time.monotonic() < deadline:
            time.sleep(0.05)
        assert outbox.refusing
        time.sleep(0.5)  # what the outbox held before has gone out
        results, telemetry = len(watcher.on("results/cam")), len(watcher.on("telemetry"))
        watcher.wait(
            lambda m: len(watcher.on("results/cam")) >= results + 5,
            what="results while the disk refuses the outbox",
        )
        latest = watcher.wait(
            lambda m: m.leaf == "telemetry" and len(watcher.on("telemetry")) >= telemetry + 2,
            what="telemetry while the disk refuses the outbox",
        )
        # Nothing was kept to send again: the drop counts, in telemetry too, say so.
        stats = outbox.stats()
        assert stats.dropped_result > 0
        assert stats.dropped_telemetry > 0
        assert latest.json()["agent"]["outbox_dropped"] > 0
        with outbox._lock:
            outbox._db.execute("PRAGMA query_only = OFF")
    finally:
        agent.close()
