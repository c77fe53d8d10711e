"""`Integrations`: the one object the agent service holds for all integrations.

The service calls its hooks from the places it already publishes (an event, a
result, telemetry, a connect, its loop, its stop); each hook does nothing for
an integration that is off, and a failing integration is logged, never raised
into the agent's own publishing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from edge_agent import __version__
from edge_agent.config.agent import IntegrationsConfig
from edge_agent.integrations import journald
from edge_agent.integrations.homeassistant import (
    Discovery,
    HomeAssistant,
    Publish,
    RunningLabels,
    Subscribe,
    object_id,
)
from edge_agent.integrations.prometheus import PrometheusExporter
from edge_agent.logs import error_text, log_event
from edge_agent.pipelines.runner import PipelineHandle
from edge_agent.protocol.agent import (
    AgentEvent,
    DetectionEvent,
    ResultMessage,
    State,
    Telemetry,
)
from edge_agent.protocol.topics import Topics

log = logging.getLogger(__name__)

Running = Callable[[], Mapping[str, PipelineHandle]]
"""The running pipelines' handles by id."""


class Integrations:
    """Home Assistant, Prometheus and journald, each only when configured.

    Args:
        config: The `[integrations]` table.
        device_id: This box.
        topics: The agent's topics (prefix).
        publish: Publishes one retained QoS 1 message (the service's outbox).
        running: The running pipelines.
        env: The environment ($JOURNAL_STREAM).
        journal_socket: The journal's socket (tests point it elsewhere).
        state: The agent's state as its birth says it, for the metrics telemetry lacks
            (pipelines not running, models' devices, trust).
        wanted: The pipelines the agent is to run and their rule labels (its record).
        subscribe: The agent's session's subscribe, for Home Assistant's sweep of what the
            broker retains for entities no pipeline has any more.
    """

    def __init__(
        self,
        config: IntegrationsConfig,
        device_id: str,
        topics: Topics,
        publish: Publish,
        running: Running,
        env: Mapping[str, str],
        journal_socket: str = journald.JOURNAL_SOCKET,
        state: Callable[[], State] | None = None,
        wanted: RunningLabels | None = None,
        subscribe: Subscribe | None = None,
    ) -> None:
        self._running = running
        self._state = state
        self.journal: journald.JournalLogging | None = None
        if journald.wanted(config.journald, env, journal_socket):
            self.journal = journald.JournalLogging(env, journal_socket)
        self.homeassistant: HomeAssistant | None = None
        ha = config.homeassistant
        if ha.enabled:
            discovery = Discovery(
                prefix=ha.prefix,
                node_id=ha.node_id or object_id(device_id),
                device_id=device_id,
                sw_version=__version__,
                state_topic=topics.device(device_id, "state"),
                telemetry_topic=topics.device(device_id, "telemetry"),
                occupancy_root=topics.device(device_id, "occupancy"),
            )
            self.homeassistant = HomeAssistant(
                discovery,
                publish,
                self._rule_labels,
                labels=ha.labels,
                min_score=ha.min_score,
                hold_s=ha.off_delay_s,
                wanted=wanted,
                subscribe=subscribe,
            )
        self.prometheus: PrometheusExporter | None = None
        prom = config.prometheus
        if prom.textfile is not None or prom.address is not None:
            self.prometheus = PrometheusExporter(__version__, prom.textfile, prom.address)

    def _rule_labels(self) -> dict[str, list[str]]:
        return {
            pipeline: [rule.label for rule in handle.spec.events]
            for pipeline, handle in self._running().items()
        }

    def on_connected(self) -> None:
        """After every connect (the birth is out)."""
        if self.homeassistant is not None:
            self._guard("homeassistant", self.homeassistant.on_connected)

    def on_event(self, event: AgentEvent | DetectionEvent) -> None:
        """Every event the agent publishes."""
        if self.homeassistant is not None:
            self._guard("homeassistant", self.homeassistant.on_event, event)

    def on_result(self, pipeline: str, result: ResultMessage) -> None:
        """Every result message the agent publishes."""
        if self.homeassistant is not None:
            self._guard("homeassistant", self.homeassistant.on_result, pipeline, result.results)

    def on_telemetry(self, telemetry: Telemetry) -> None:
        """Every telemetry message the agent publishes."""
        if self.prometheus is not None:
            histograms = {
                pipeline: {s: handle.telemetry.histogram(s) for s in handle.telemetry.stages}
                for pipeline, handle in self._running().items()
            }
            prometheus = self.prometheus

            def update() -> None:
                # The counters must not miss an interval for a state that would not read
                # (a store read error): the gauges from it are left out instead.
                state = None
                if self._state is not None:
                    try:
                        state = self._state()
                    except Exception as exc:
                        log_event(
                            log,
                            logging.ERROR,
                            "integration_failed",
                            integration="prometheus state",
                            error=error_text(exc),
                        )
                prometheus.update(telemetry, histograms, state)

            self._guard("prometheus", update)

    @property
    def ticking(self) -> bool:
        """Whether `tick` has work: the service's loop then runs a few times a second."""
        return self.homeassistant is not None

    def tick(self) -> None:
        """From the service's loop, a few times a second: occupancy time-outs."""
        if self.homeassistant is not None:
            self._guard("homeassistant", self.homeassistant.tick)

    def close(self) -> None:
        """Stop serving /metrics and give logging back to stderr."""
        if self.prometheus is not None:
            self.prometheus.close()
        if self.journal is not None:
            self.journal.close()

    @staticmethod
    def _guard(name: str, hook: Callable[..., Any], *args: Any) -> None:
        try:
            hook(*args)
        except Exception as exc:  # an integration must not break the agent's publishing
            log_event(
                log, logging.ERROR, "integration_failed", integration=name, error=error_text(exc)
            )
