"""Home Assistant discovery payloads and occupancy, checked against what HA requires."""

from __future__ import annotations

import json
import re
from typing import Literal

import pytest

from edge_agent.integrations.homeassistant import (
    Discovery,
    HomeAssistant,
    object_id,
    occupancy_topic,
    pipeline_configs,
)
from edge_agent.integrations.occupancy import Change, Occupancy, present_labels
from edge_agent.protocol.agent import AgentEvent, DetectionEvent

# HA's own discovery topic pattern (homeassistant/components/mqtt/discovery.py), after the
# prefix: ids outside [a-zA-Z0-9_-] are silently never discovered.
HA_TOPIC = re.compile(
    r"^homeassistant/(?P<component>\w+)/(?:(?P<node_id>[a-zA-Z0-9_-]+)/)"
    r"?(?P<object_id>[a-zA-Z0-9_-]+)/config$"
)
AVAILABILITY_KEYS = {"topic", "value_template", "payload_available", "payload_not_available"}

D = Discovery(
    prefix="homeassistant",
    node_id="dock-7",
    device_id="dock-7",
    sw_version="1.2.3",
    state_topic="edge/v1/dock-7/state",
    telemetry_topic="edge/v1/dock-7/telemetry",
    occupancy_root="edge/v1/dock-7/occupancy",
)


def test_every_config_topic_is_one_ha_discovers_and_ids_are_unique() -> None:
    configs = pipeline_configs(D, "yard.cam-1", ["person", "traffic light", "car"])
    components = []
    for topic, payload in configs:
        match = HA_TOPIC.match(topic)
        assert match, topic
        assert match["node_id"] == "dock-7"
        components.append(match["component"])
        assert payload["unique_id"].startswith("edge_agent_dock-7_")
    assert components == ["binary_sensor"] * 3 + ["sensor", "sensor"]
    assert len({p["unique_id"] for _, p in configs}) == len(configs)
    assert len({t for t, _ in configs}) == len(configs)


def test_binary_sensor_payload_has_what_ha_needs() -> None:
    (topic, payload), *_ = pipeline_configs(D, "dock", ["person"])
    assert topic == "homeassistant/binary_sensor/dock-7/dock_person_occupancy/config"
    assert payload["device_class"] == "occupancy"
    assert payload["state_topic"] == "edge/v1/dock-7/occupancy/dock/person"
    assert (payload["payload_on"], payload["payload_off"]) == ("ON", "OFF")
    device = payload["device"]
    assert device["identifiers"] == ["edge_agent_dock-7"]
    assert (device["name"], device["model"], device["sw_version"]) == (
        "dock-7",
        "edge-agent",
        "1.2.3",
    )
    [available] = payload["availability"]
    assert set(available) == AVAILABILITY_KEYS
    assert available["topic"] == D.state_topic
    assert "value_json.online" in available["value_template"]
    assert (available["payload_available"], available["payload_not_available"]) == (
        "online",
        "offline",
    )
    assert "entity_category" not in payload  # occupancy is the point, not a diagnostic


def test_diagnostic_sensors_read_fps_and_p95_out_of_telemetry() -> None:
    *_, (fps_topic, fps), (lat_topic, latency) = pipeline_configs(D, "dock", ["person"])
    assert fps_topic == "homeassistant/sensor/dock-7/dock_fps/config"
    assert lat_topic == "homeassistant/sensor/dock-7/dock_p95_latency/config"
    for payload in (fps, latency):
        assert payload["entity_category"] == "diagnostic"
        assert payload["state_topic"] == D.telemetry_topic
        assert payload["state_class"] == "measurement"
        assert payload["availability"][0]["topic"] == D.state_topic
    assert fps["unit_of_measurement"] == "fps"
    assert "value_json.pipelines['dock'].fps" in fps["value_template"]
    assert (latency["unit_of_measurement"], latency["device_class"]) == ("ms", "duration")
    assert "stages.end_to_end.p95_ms" in latency["value_template"]
    # A missing pipeline or stage renders HA's "None" (unknown), not a template error.
    assert "else None" in fps["value_template"]
    assert "'end_to_end' in" in latency["value_template"]


def test_object_ids_never_collide_when_characters_are_replaced() -> None:
    assert object_id("dock") == "dock"
    assert object_id("a.b") != object_id("a_b")
    assert re.fullmatch(r"[A-Za-z0-9_-]+", object_id("traffic light/#"))
    assert occupancy_topic(D, "dock", "traffic light").endswith(
        "/dock/" + object_id("traffic light")
    )


def test_present_labels_follow_the_event_rules_idea_of_present() -> None:
    results = [
        {"kind": "detection", "label": "person", "score": 0.9, "box": [0, 0, 1, 1]},
        {"kind": "detection", "label": "car", "score": 0.2, "box": [0, 0, 1, 1]},
        {"kind": "class", "label": "cat", "score": 0.7},
        {"kind": "class", "label": "dog", "score": 0.2},
        {"kind": "speech", "start": 0.0, "end": 1.0},
    ]
    assert present_labels(results, 0.5) == {"person", "cat", "speech"}
    assert present_labels([], 0.5) == set()


def test_occupancy_from_results_holds_then_times_out() -> None:
    occ = Occupancy(hold_s=2.0)
    assert occ.watch("dock", ["person", "car"]) == [
        Change("dock", "car", False),
        Change("dock", "person", False),
    ]
    assert occ.seen("dock", {"person", "dog"}, 10.0) == [Change("dock", "person", True)]
    assert occ.seen("dock", {"person"}, 11.0) == []
    assert occ.expire(12.5) == []
    assert occ.expire(13.01) == [Change("dock", "person", False)]
    assert occ.seen("other", {"person"}, 14.0) == []  # not watched


def test_occupancy_from_tracks_lasts_until_the_last_track_ends() -> None:
    occ = Occupancy(hold_s=0.0)
    occ.watch("dock", ["person"])
    assert occ.track("dock", "person", "1", "new", 1.0) == [Change("dock", "person", True)]
    assert occ.track("dock", "person", "2", "new", 1.1) == []
    assert occ.track("dock", "person", "1", "end", 2.0) == []
    assert occ.expire(50.0) == []  # track 2 is still open, however long
    assert occ.track("dock", "person", "2", "end", 51.0) == [Change("dock", "person", False)]
    assert occ.track("dock", "car", "3", "new", 52.0) == []  # not watched


def test_a_lost_source_closes_tracks_that_will_never_end() -> None:
    occ = Occupancy(hold_s=1.0)
    occ.watch("dock", ["person"])
    occ.track("dock", "person", "1", "update", 1.0)
    assert occ.lost("dock", 2.0) == [Change("dock", "person", False)]
    assert occ.forget("dock") == ["person"]
    assert occ.labels("dock") == []


class Recorder:
    def __init__(self) -> None:
        self.messages: list[tuple[str, bytes]] = []

    def __call__(self, topic: str, payload: bytes) -> None:
        self.messages.append((topic, payload))

    def on(self, topic: str) -> list[bytes]:
        return [p for t, p in self.messages if t == topic]


def _adapter(running: dict[str, list[str]], now: list[float]) -> tuple[HomeAssistant, Recorder]:
    sent = Recorder()
    ha = HomeAssistant(
        D, sent, lambda: running, labels=["person"], hold_s=1.0, clock=lambda: now[0]
    )
    return ha, sent


def _event(kind: str, pipeline: str) -> AgentEvent:
    return AgentEvent.model_validate({"kind": kind, "ts": 0.0, "pipeline": pipeline})


def _detection(phase: Literal["new", "update", "end"], track: str, label: str) -> DetectionEvent:
    return DetectionEvent(
        type=phase,
        id=track,
        pipeline="dock",
        label=label,
        score=0.9,
        box=(0, 0, 1, 1),
        start_time=0.0,
    )


def test_adapter_announces_on_start_and_withdraws_exactly_that_on_stop() -> None:
    now = [100.0]
    ha, sent = _adapter({"dock": ["car"]}, now)
    ha.on_event(_event("pipeline_started", "dock"))
    configs = [(t, json.loads(p)) for t, p in sent.messages if t.startswith("homeassistant/")]
    assert len(configs) == 4  # person (config) + car (rule) + fps + latency
    person = occupancy_topic(D, "dock", "person")
    car = occupancy_topic(D, "dock", "car")
    assert sent.on(person) == [b"OFF"]
    assert sent.on(car) == [b"OFF"]

    ha.on_result("dock", [{"kind": "detection", "label": "person", "score": 0.8}])
    assert sent.on(person) == [b"OFF", b"ON"]
    ha.on_event(_detection("new", "7", "car"))
    assert sent.on(car) == [b"OFF", b"ON"]
    now[0] = 101.5
    ha.tick()
    assert sent.on(person) == [b"OFF", b"ON", b"OFF"]
    assert ha.occupied("dock", "car")

    sent.messages.clear()
    ha.on_event(_event("pipeline_stopped", "dock"))
    removed = {t for t, p in sent.messages if p == b""}
    assert removed == {t for t, _ in configs} | {person, car}
    assert all(p == b"" for _, p in sent.messages)
    sent.messages.clear()
    ha.on_event(_event("pipeline_stopped", "dock"))  # twice: the configured ones again
    assert {t for t, p in sent.messages if p == b""} == {
        t for t, _ in pipeline_configs(D, "dock", ["person"])
    } | {person}
    assert all(p == b"" for _, p in sent.messages)


def test_a_pipeline_never_announced_here_has_its_entities_cleared_on_stop() -> None:
    # It failed to come back after a restart, so this process never announced it; its
    # entities, an occupancy left "ON" among them, stayed retained for good after a stop.
    ha, sent = _adapter({}, [100.0])
    ha.on_event(_event("pipeline_stopped", "dock"))
    cleared = {t for t, p in sent.messages if p == b""}
    assert occupancy_topic(D, "dock", "person") in cleared
    assert {t for t, _ in pipeline_configs(D, "dock", ["person"])} <= cleared


def test_reconnect_republishes_configs_and_current_states() -> None:
    now = [0.0]
    ha, sent = _adapter({"dock": []}, now)
    ha.on_connected()
    ha.on_result("dock", [{"kind": "detection", "label": "person", "score": 0.8}])
    sent.messages.clear()
    ha.on_connected()
    assert sent.on(occupancy_topic(D, "dock", "person")) == [b"ON"]
    assert len([t for t, _ in sent.messages if t.endswith("/config")]) == 3


@pytest.mark.parametrize("kind", ["pipeline_failed", "source_lost"])
def test_failures_release_tracked_occupancy(kind: str) -> None:
    now = [0.0]
    ha, sent = _adapter({"dock": []}, now)
    ha.on_connected()
    ha.on_event(_detection("update", "1", "person"))
    ha.on_event(_event(kind, "dock"))
    assert sent.on(occupancy_topic(D, "dock", "person"))[-1] == b"OFF"


def test_two_pairs_that_split_an_underscore_differently_are_two_entities() -> None:
    # "front_door" + "person" and "front" + "door_person" were one unique_id and one config
    # topic: each pipeline's entity overwrote the other's, and one state showed for both.
    a = pipeline_configs(D, "front_door", ["person"])[0]
    b = pipeline_configs(D, "front", ["door_person"])[0]
    assert a[0] != b[0]
    assert a[1]["unique_id"] != b[1]["unique_id"]
    assert a[1]["state_topic"] != b[1]["state_topic"]
    # A pair with no '_' in either keeps the id it always had: no entity of a fleet moves.
    (topic, _), *_ = pipeline_configs(D, "dock", ["person"])
    assert topic.endswith("/dock_person_occupancy/config")
