"""Integrations against a real mosquitto, read back with mosquitto_sub and real HTTP.

The last test runs the whole agent on a real pipeline (person-ssdlite on the walk
video): Home Assistant sees the pipeline's entities appear, the person come and
go, and the entities withdrawn when the video ends; Prometheus serves the
pipeline's real latency histograms.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from edge_agent.agent.service import AgentService
from edge_agent.clips import write_walk
from edge_agent.comms.base import Message
from edge_agent.comms.local_broker import LocalBroker, free_port
from edge_agent.comms.session import MqttSession, connect
from edge_agent.comms.settings import BrokerSettings
from edge_agent.config.agent import AgentConfig
from edge_agent.integrations.homeassistant import Discovery, HomeAssistant

DEVICE = "dock-7"
DISCOVERY = Discovery(
    prefix="homeassistant",
    node_id=DEVICE,
    device_id=DEVICE,
    sw_version="test",
    state_topic=f"edge/v1/{DEVICE}/state",
    telemetry_topic=f"edge/v1/{DEVICE}/telemetry",
    occupancy_root=f"edge/v1/{DEVICE}/occupancy",
)


def retained(broker: LocalBroker, *topics: str, wait_s: float = 1.0) -> dict[str, bytes]:
    """Every retained message under `topics`, as mosquitto_sub (a client no one here wrote)
    sees it."""
    args = ["mosquitto_sub", "-h", broker.host, "-p", str(broker.port), "-v", "--retained-only"]
    for topic in topics:
        args += ["-t", topic]
    done = subprocess.run(
        [*args, "-W", str(int(wait_s))], capture_output=True, timeout=10 + wait_s, check=False
    )
    found = {}
    for line in done.stdout.decode().splitlines():
        topic, _, payload = line.partition(" ")
        found[topic] = payload.encode()
    return found


@pytest.fixture
def client(broker: LocalBroker) -> Iterator[MqttSession]:
    session = connect(BrokerSettings(host=broker.host, port=broker.port))
    yield session
    session.stop(2.0)


def test_discovery_is_retained_where_ha_looks_and_withdrawal_clears_it(
    broker: LocalBroker, client: MqttSession
) -> None:
    def publish(topic: str, payload: bytes) -> None:
        client.publish(topic, payload, qos=1, retain=True)

    discovery = DISCOVERY
    ha = HomeAssistant(discovery, publish, lambda: {"dock": ["car"]})
    ha.on_connected()
    ha.on_result("dock", [{"kind": "detection", "label": "car", "score": 0.9}])
    assert client.flush(5.0)
    found = retained(broker, "homeassistant/#", f"edge/v1/{DEVICE}/occupancy/#")
    configs = {t: json.loads(p) for t, p in found.items() if t.startswith("homeassistant/")}
    assert set(configs) == {
        f"homeassistant/binary_sensor/{DEVICE}/dock_person_occupancy/config",
        f"homeassistant/binary_sensor/{DEVICE}/dock_car_occupancy/config",
        f"homeassistant/sensor/{DEVICE}/dock_fps/config",
        f"homeassistant/sensor/{DEVICE}/dock_p95_latency/config",
    }
    assert found[f"edge/v1/{DEVICE}/occupancy/dock/car"] == b"ON"
    assert found[f"edge/v1/{DEVICE}/occupancy/dock/person"] == b"OFF"

    ha.withdraw("dock")
    assert client.flush(5.0)
    assert retained(broker, "homeassistant/#", f"edge/v1/{DEVICE}/occupancy/#") == {}


def test_entities_no_pipeline_has_any_more_are_cleared_at_connect(
    broker: LocalBroker, client: MqttSession
) -> None:
    # Left retained by an earlier run: `gone` was removed while the agent was down, and
    # `dock` watched `bicycle` then. `yard` is in the agent's record but has not started:
    # its entities stay. They were left for good, for a hand in HA to remove.
    discovery = DISCOVERY
    stale = {
        f"homeassistant/binary_sensor/{DEVICE}/gone_person_occupancy/config": b"{}",
        f"homeassistant/sensor/{DEVICE}/gone_fps/config": b"{}",
        f"edge/v1/{DEVICE}/occupancy/gone/person": b"ON",
        f"homeassistant/binary_sensor/{DEVICE}/dock_bicycle_occupancy/config": b"{}",
        f"edge/v1/{DEVICE}/occupancy/dock/bicycle": b"ON",
    }
    kept = {
        f"homeassistant/binary_sensor/{DEVICE}/yard_car_occupancy/config": b"{}",
        f"homeassistant/sensor/{DEVICE}/yard_fps/config": b"{}",
        f"edge/v1/{DEVICE}/occupancy/yard/person": b"OFF",
        # Another box's, under the same prefix: never this one's to touch.
        "homeassistant/binary_sensor/dock-8/gone_person_occupancy/config": b"{}",
    }
    for topic, payload in {**stale, **kept}.items():
        client.publish(topic, payload, qos=1, retain=True)
    assert client.flush(5.0)

    agent = connect(BrokerSettings(host=broker.host, port=broker.port))
    try:
        ha = HomeAssistant(
            discovery,
            lambda topic, payload: agent.publish(topic, payload, qos=1, retain=True),
            lambda: {"dock": ["car"]},
            wanted=lambda: {"dock": ["car"], "yard": ["car"]},
            subscribe=lambda topic_filter, handler: agent.subscribe(topic_filter, handler),
        )
        ha.on_connected()
        _wait(lambda: ha.swept >= len(stale), 10, "the stale entities to be cleared")
        assert agent.flush(5.0)
        found = retained(broker, "homeassistant/#", f"edge/v1/{DEVICE}/occupancy/#")
    finally:
        agent.stop(2.0)
    assert ha.swept == len(stale)
    assert not set(stale) & set(found), found
    assert set(kept) <= set(found)
    assert f"homeassistant/binary_sensor/{DEVICE}/dock_car_occupancy/config" in found


def _wait(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_the_agent_drives_home_assistant_and_prometheus_from_a_real_pipeline(
    broker: LocalBroker, client: MqttSession, cache_dir: Path, tmp_path: Path
) -> None:
    walk = write_walk(tmp_path / "walk.avi", empty=10, crossing=15)
    textfile = tmp_path / "edge_agent.prom"
    port = free_port()
    config = AgentConfig.model_validate(
        {
            "device_id": DEVICE,
            "state_dir": str(tmp_path / "state"),
            "cache_dir": str(cache_dir),
            "telemetry_interval_s": 1.0,
            "mqtt": {"host": broker.host, "port": broker.port, "keepalive": 10},
            "integrations": {
                "homeassistant": {"enabled": True, "off_delay_s": 0.3},
                "prometheus": {"textfile": str(textfile), "listen": f"127.0.0.1:{port}"},
            },
        }
    )
    seen: list[tuple[str, bytes]] = []
    lock = threading.Lock()

    def record(message: Message) -> None:
        with lock:
            seen.append((message.topic, message.payload))

    def payloads(topic: str) -> list[bytes]:
        with lock:
            return [p for t, p in seen if t == topic]

    occupancy = f"edge/v1/{DEVICE}/occupancy/walk/person"
    person_config = f"homeassistant/binary_sensor/{DEVICE}/walk_person_occupancy/config"
    client.subscribe("homeassistant/#", record)
    client.subscribe(f"edge/v1/{DEVICE}/occupancy/#", record)
    client.subscribe(f"edge/v1/{DEVICE}/events", record)

    # Left by an earlier run whose config watched `bicycle` too: the agent clears it.
    client.publish(
        f"homeassistant/binary_sensor/{DEVICE}/walk_bicycle_occupancy/config",
        b"{}",
        qos=1,
        retain=True,
    )
    assert client.flush(5.0)
    service = AgentService(config, {})
    stop = threading.Event()
    runner = threading.Thread(target=service.run, args=(stop,), daemon=True)
    runner.start()
    metrics_seen = textfile_seen = ""
    try:
        _wait(service.session.connected.is_set, 10, "the agent to connect")
        spec = {
            "id": "walk",
            "model": {"name": "person-ssdlite"},
            "source": {"type": "file", "path": str(walk.path), "realtime": True},
            "sinks": [],
        }
        command = {"id": "start-1", "type": "start_pipeline", "args": {"spec": spec}}
        client.publish(
            f"edge/v1/{DEVICE}/cmd", json.dumps(command | {"sent_at": time.time()}).encode(), qos=1
        )
        _wait(lambda: b"ON" in payloads(occupancy), 30, "the person to occupy")

        def histogram_served() -> bool:
            # Both while the pipeline runs: the telemetry after its file played out renders
            # no histogram for it, and under load one came before the agent was stopped.
            nonlocal metrics_seen, textfile_seen
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                metrics_seen = r.read().decode()
            textfile_seen = textfile.read_text()
            bucket = 'pipeline="walk",stage="infer",le="+Inf"'
            return bucket in metrics_seen and bucket in textfile_seen

        _wait(histogram_served, 10, "the pipeline's histograms on /metrics")
        _wait(lambda: b"" in payloads(person_config), 30, "the entities to be withdrawn")
        # Their retained states are cleared just after, and a clean stop leaves what it has
        # not sent in the outbox for the next start: stopping at once lost the race to
        # them under load (the suite on two cores), not on a quiet machine.
        _wait(lambda: payloads(occupancy)[-1:] == [b""], 30, "the states to be cleared")
    finally:
        stop.set()
        service.wake()
        runner.join(20)
    assert not runner.is_alive()

    # HA saw the entity appear, the person come and go, and the entity withdrawn, in order.
    config_payloads = payloads(person_config)
    assert json.loads(config_payloads[0])["state_topic"] == occupancy
    assert config_payloads[-1] == b""
    states = payloads(occupancy)
    assert states[:3] == [b"OFF", b"ON", b"OFF"], states
    assert states[-1] == b""
    assert 'edge_agent_frames_total{pipeline="walk"}' in metrics_seen
    assert 'edge_agent_pipeline_up{pipeline="walk"} 1' in metrics_seen  # from the agent's state
    assert "edge_agent_unverified 1" in metrics_seen  # this agent has no trusted keys
    assert "edge_agent_stage_latency_seconds_bucket" in textfile_seen
    # The counters outlive the pipeline in the file node_exporter reads after the stop.
    assert 'edge_agent_frames_total{pipeline="walk"}' in textfile.read_text()
    # Nothing of the stopped pipeline is left retained for HA to rediscover.
    assert retained(broker, "homeassistant/#", f"edge/v1/{DEVICE}/occupancy/#") == {}
