"""Home Assistant MQTT discovery: the agent's pipelines appear in HA as entities.

For each running pipeline the agent publishes, retained, on
`<ha prefix>/<component>/<node_id>/<object_id>/config`:
- a `binary_sensor` (device class occupancy) per watched label, ON while an
  object of that label is there; its state is retained on
  `<prefix>/<device>/occupancy/<pipeline>/<label>` as ON/OFF;
- diagnostic `sensor`s for the pipeline's FPS and p95 end-to-end latency,
  read by a value_template straight out of the agent's `telemetry` messages.

Every entity is available while the agent's retained `state` says
`online: true` (a value_template on the topic the MQTT will also lands on), and
all hang off one HA device named after the box. Stopping a pipeline withdraws
its entities: an empty retained payload on each config topic removes them
from HA and the retained message from the broker.

The builders are pure functions returning (topic, payload) pairs; the
`HomeAssistant` adapter keeps occupancy and hands the pairs to `publish`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from edge_agent.comms.base import Message
from edge_agent.integrations.occupancy import Change, Occupancy, present_labels
from edge_agent.logs import log_event
from edge_agent.protocol.agent import AgentEvent, DetectionEvent

log = logging.getLogger(__name__)

Publish = Callable[[str, bytes], None]
"""Publish one retained message (QoS 1); an empty payload deletes."""

ON, OFF = b"ON", b"OFF"
LATENCY_STAGE = "end_to_end"

_NOT_ID = re.compile(r"[^A-Za-z0-9_-]")


def object_id(text: str) -> str:
    """`text` as an HA discovery id ([A-Za-z0-9_-]+): other characters become '_', and
    a short digest keeps two texts that differ only there from colliding."""
    slug = _NOT_ID.sub("_", text)
    if slug == text and slug:
        return slug
    return f"{slug}_{hashlib.sha256(text.encode()).hexdigest()[:6]}"


@dataclass(frozen=True, slots=True)
class Discovery:
    """Everything the discovery payloads are built from."""

    prefix: str
    """HA's discovery prefix, usually `homeassistant`."""
    node_id: str
    device_id: str
    sw_version: str
    state_topic: str
    """The agent's retained state: birth `{online: true}`, will `{online: false}`."""
    telemetry_topic: str
    occupancy_root: str
    """`<prefix>/<device>/occupancy`."""

    @property
    def unique_prefix(self) -> str:
        return f"edge_agent_{self.node_id}"


def device_block(d: Discovery) -> dict[str, Any]:
    """The HA device every entity belongs to: the box."""
    return {
        "identifiers": [d.unique_prefix],
        "name": d.device_id,
        "manufacturer": "edge-agent",
        "model": "edge-agent",
        "sw_version": d.sw_version,
    }


def availability(d: Discovery) -> list[dict[str, str]]:
    """Available while the retained state says online (the will says otherwise)."""
    return [
        {
            "topic": d.state_topic,
            "value_template": "{{ 'online' if value_json.online else 'offline' }}",
            "payload_available": "online",
            "payload_not_available": "offline",
        }
    ]


def occupancy_topic(d: Discovery, pipeline: str, label: str) -> str:
    """Where a pair's ON/OFF is retained."""
    return f"{d.occupancy_root}/{pipeline}/{object_id(label)}"


def _common(d: Discovery, name: str, unique: str) -> dict[str, Any]:
    return {
        "name": name,
        "unique_id": f"{d.unique_prefix}_{unique}",
        "device": device_block(d),
        "availability": availability(d),
        "origin": {"name": "edge-agent", "sw_version": d.sw_version},
    }


def _topic(d: Discovery, component: str, unique: str) -> str:
    return f"{d.prefix}/{component}/{d.node_id}/{unique}/config"


def pair_id(pipeline: str, label: str) -> str:
    """One id for a (pipeline, label) pair, never another pair's.

    Joined by '_' alone, ids that hold a '_' of their own are ambiguous: pipeline
    `front_door` with label `person` and pipeline `front` with label `door_person` were one
    entity, each pipeline's state overwriting the other's. Such a pair takes a digest of
    both; a pair with no '_' in either id keeps the id it always had.
    """
    a, b = object_id(pipeline), object_id(label)
    if "_" not in a and "_" not in b:
        return f"{a}_{b}"
    digest = hashlib.sha256(json.dumps([pipeline, label]).encode()).hexdigest()[:6]
    return f"{a}_{b}_{digest}"


def occupancy_config(d: Discovery, pipeline: str, label: str) -> tuple[str, dict[str, Any]]:
    """The occupancy binary_sensor of one pipeline and label."""
    unique = f"{pair_id(pipeline, label)}_occupancy"
    payload = _common(d, f"{pipeline} {label}", unique) | {
        "device_class": "occupancy",
        "state_topic": occupancy_topic(d, pipeline, label),
        "payload_on": ON.decode(),
        "payload_off": OFF.decode(),
    }
    return _topic(d, "binary_sensor", unique), payload


def _pipeline_value(pipeline: str, path: str, guard: str = "") -> str:
    # "None" makes HA show unknown (its PAYLOAD_NONE) while the pipeline or stage is
    # missing from a telemetry message, instead of logging a template error.
    p = f"value_json.pipelines['{pipeline}']"
    condition = f"'{pipeline}' in value_json.pipelines"
    if guard:
        condition += f" and '{guard}' in {p}.stages"
    return f"{{{{ {p}.{path} if {condition} else None }}}}"


def fps_config(d: Discovery, pipeline: str) -> tuple[str, dict[str, Any]]:
    """The diagnostic FPS sensor of one pipeline."""
    unique = f"{object_id(pipeline)}_fps"
    payload = _common(d, f"{pipeline} FPS", unique) | {
        "entity_category": "diagnostic",
        "state_topic": d.telemetry_topic,
        "value_template": _pipeline_value(pipeline, "fps"),
        "unit_of_measurement": "fps",
        "state_class": "measurement",
        "suggested_display_precision": 1,
        "icon": "mdi:speedometer",
    }
    return _topic(d, "sensor", unique), payload


def latency_config(d: Discovery, pipeline: str) -> tuple[str, dict[str, Any]]:
    """The diagnostic p95 end-to-end latency sensor of one pipeline, in milliseconds."""
    unique = f"{object_id(pipeline)}_p95_latency"
    payload = _common(d, f"{pipeline} p95 latency", unique) | {
        "entity_category": "diagnostic",
        "state_topic": d.telemetry_topic,
        "value_template": _pipeline_value(
            pipeline, f"stages.{LATENCY_STAGE}.p95_ms", guard=LATENCY_STAGE
        ),
        "unit_of_measurement": "ms",
        "device_class": "duration",
        "state_class": "measurement",
        "suggested_display_precision": 1,
    }
    return _topic(d, "sensor", unique), payload


def pipeline_configs(
    d: Discovery, pipeline: str, labels: Iterable[str]
) -> list[tuple[str, dict[str, Any]]]:
    """Every discovery config of one pipeline."""
    configs = [occupancy_config(d, pipeline, label) for label in sorted(set(labels))]
    return [*configs, fps_config(d, pipeline), latency_config(d, pipeline)]


def config_filter(d: Discovery) -> str:
    """Every discovery config of this node, whatever its component and object id."""
    return f"{d.prefix}/+/{d.node_id}/+/config"


def occupancy_filter(d: Discovery) -> str:
    """Every retained occupancy state of this box."""
    return f"{d.occupancy_root}/+/+"


def encode(payload: Mapping[str, Any]) -> bytes:
    """A discovery payload as compact JSON."""
    return json.dumps(payload, separators=(",", ":"), sort_keys=True).encode()


RunningLabels = Callable[[], Mapping[str, Sequence[str]]]
"""The running pipelines and the labels their event rules watch."""

Subscribe = Callable[[str, Callable[[Message], None]], object]
"""Subscribe a handler to a topic filter, kept across reconnects (the agent's session)."""


class HomeAssistant:
    """Keeps HA's view of the agent in step: discovery, occupancy, withdrawal. Thread-safe.

    Args:
        discovery: Topics and device identity.
        publish: Publishes one retained message (the service's outbox).
        running: The running pipelines and their rule labels.
        labels: Labels watched on every pipeline besides its rules' labels.
        wanted: The pipelines the agent is to run (its record), running yet or not, and
            their rule labels: their entities are kept while they start.
        subscribe: With it, the retained discovery configs and occupancy states of this
            node that belong to none of those pipelines are cleared at each connect: a
            label taken out of the config, a rule edited while the agent was down, or a
            pipeline removed then, left entities that only a hand in HA could remove.
        min_score: Results below this do not occupy.
        hold_s: Seconds a label seen in results keeps its pair occupied.
        clock: Monotonic seconds, injectable.
    """

    def __init__(
        self,
        discovery: Discovery,
        publish: Publish,
        running: RunningLabels,
        labels: Sequence[str] = ("person",),
        min_score: float = 0.5,
        hold_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        wanted: RunningLabels | None = None,
        subscribe: Subscribe | None = None,
    ) -> None:
        self.discovery = discovery
        self._publish = publish
        self._running = running
        self._wanted = wanted or (lambda: {})
        self._subscribe = subscribe
        self._subscribed = False
        self.swept = 0
        """Retained topics of entities nobody runs, cleared since the start."""
        self._labels = tuple(labels)
        self._min_score = min_score
        self._clock = clock
        self._occupancy = Occupancy(hold_s)
        self._lock = threading.Lock()

    def announce(self, pipeline: str, rule_labels: Iterable[str] = ()) -> None:
        """Publish a pipeline's entities and the state of each occupancy pair."""
        labels = sorted({*self._labels, *rule_labels})
        with self._lock:
            for topic, payload in pipeline_configs(self.discovery, pipeline, labels):
                self._publish(topic, encode(payload))
            self._occupancy.watch(pipeline, labels)
            for label in labels:
                occupied = self._occupancy.occupied(pipeline, label)
                self._publish(
                    occupancy_topic(self.discovery, pipeline, label), ON if occupied else OFF
                )

    def withdraw(self, pipeline: str) -> None:
        """Remove a pipeline's entities from HA and its retained states from the broker.

        Those this process announced, and those of the configured labels whether it did or
        not: a pipeline that failed to come back after a restart was never announced, and a
        stop left its entities, an occupancy "ON" among them, retained for good. (Clearing a
        retained topic twice is harmless.)
        """
        with self._lock:
            labels = sorted({*self._occupancy.forget(pipeline), *self._labels})
            for topic, _ in pipeline_configs(self.discovery, pipeline, labels):
                self._publish(topic, b"")
            for label in labels:
                self._publish(occupancy_topic(self.discovery, pipeline, label), b"")

    def on_connected(self) -> None:
        """(Re)announce every running pipeline: a broker without persistence forgot them.
        Then, once, subscribe to what the broker retains for this node: it sends it again
        at every connect, and `_sweep` clears what is no one's."""
        for pipeline, rule_labels in self._running().items():
            self.announce(pipeline, rule_labels)
        if self._subscribe is not None and not self._subscribed:
            self._subscribed = True
            self._subscribe(config_filter(self.discovery), self._sweep)
            self._subscribe(occupancy_filter(self.discovery), self._sweep)

    def _kept(self, sources: Sequence[Mapping[str, Sequence[str]]]) -> set[str]:
        """The retained topics that belong: the configs and states of every pipeline that
        runs, or is to run (restored after a restart, it may not have started yet)."""
        pipelines: dict[str, set[str]] = {}
        for source in sources:
            for pipeline, rule_labels in source.items():
                pipelines.setdefault(pipeline, set()).update(rule_labels)
        kept: set[str] = set()
        for pipeline, watched in pipelines.items():
            labels = {*self._labels, *watched, *self._occupancy.labels(pipeline)}
            kept.update(topic for topic, _ in pipeline_configs(self.discovery, pipeline, labels))
            kept.update(occupancy_topic(self.discovery, pipeline, label) for label in labels)
        return kept

    def _sweep(self, message: Message) -> None:
        # Only what the broker held when the subscription was made (or remade, at a
        # reconnect) comes flagged retained: a live publish, this agent's own included,
        # does not, and an empty payload is a clear already done.
        if not message.retain or not message.payload:
            return
        # Asked before the lock, as `on_connected` and `on_event` ask: the pipelines' own
        # lock is taken while they call `on_event`, which takes this one.
        sources = (self._wanted(), self._running())
        with self._lock:
            if message.topic in self._kept(sources):
                return
            self._publish(message.topic, b"")
            self.swept += 1
        log_event(log, logging.INFO, "homeassistant_entity_swept", topic=message.topic)

    def on_event(self, event: AgentEvent | DetectionEvent) -> None:
        """Follow pipelines starting and stopping, and tracked objects coming and going."""
        if isinstance(event, DetectionEvent):
            with self._lock:
                self._send(
                    self._occupancy.track(
                        event.pipeline, event.label, event.id, event.type, self._clock()
                    )
                )
        elif event.pipeline is None:
            return
        elif event.kind == "pipeline_started":
            rule_labels = self._running().get(event.pipeline)
            if rule_labels is not None:
                self.announce(event.pipeline, rule_labels)
        elif event.kind == "pipeline_stopped":
            self.withdraw(event.pipeline)
        elif event.kind in ("pipeline_failed", "source_lost"):
            with self._lock:
                self._send(self._occupancy.lost(event.pipeline, self._clock()))

    def on_result(self, pipeline: str, results: Sequence[Mapping[str, Any]]) -> None:
        """One frame's published results."""
        labels = present_labels(results, self._min_score)
        with self._lock:
            self._send(self._occupancy.seen(pipeline, labels, self._clock()))

    def tick(self) -> None:
        """Turn off pairs whose label has not been seen for the hold time."""
        with self._lock:
            self._send(self._occupancy.expire(self._clock()))

    def occupied(self, pipeline: str, label: str) -> bool:
        """Current occupancy of one pair."""
        with self._lock:
            return self._occupancy.occupied(pipeline, label)

    def _send(self, changes: list[Change]) -> None:
        for change in changes:
            self._publish(
                occupancy_topic(self.discovery, change.pipeline, change.label),
                ON if change.occupied else OFF,
            )
