"""The box's clock steps while the agent runs: it goes on serving.

Edge boxes often have no clock battery. They boot in 1970 or at the image's build date,
and NTP steps the clock when it first syncs, by years, and sometimes backwards. The
agent measures durations on the monotonic clock; the wall clock only labels messages.
Here the wall clock of the whole process steps back five years (and then forward again)
under a running agent, as an NTP step does to every reader of it.

Uptime was once the wall clock's difference: stepped back past it, it went negative,
the telemetry model refused it, and no telemetry went out until the clock came back.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from edge_agent.comms.local_broker import LocalBroker
from tests.agent_kit import InProcessAgent, Watcher, write_config

DEVICE = "clock-dev"
STEP_S = 5 * 365 * 86400.0


@pytest.fixture
def watcher(broker: LocalBroker) -> Iterator[Watcher]:
    running = Watcher(broker.port, DEVICE)
    yield running
    running.close()


def _next_telemetry(watcher: Watcher, after: int, timeout: float = 10.0) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = watcher.on("telemetry")
        if len(found) > after:
            telemetry: dict[str, object] = found[after].json()
            return telemetry
        time.sleep(0.05)
    raise AssertionError(f"no telemetry message number {after + 1} within {timeout} s")


def test_telemetry_and_commands_go_on_when_the_clock_steps_back_and_forth(
    broker: LocalBroker, watcher: Watcher, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = write_config(
        tmp_path / "agent.toml", port=broker.port, device=DEVICE, state=tmp_path / "state"
    )
    agent = InProcessAgent(config)
    real = time.time
    try:
        watcher.wait_state(lambda s: s["online"], timeout=60)
        seen = len(watcher.on("telemetry"))
        first = _next_telemetry(watcher, seen)

        monkeypatch.setattr(time, "time", lambda: real() - STEP_S)
        seen = len(watcher.on("telemetry"))
        # The first message may have been made before the step; the second was not.
        _next_telemetry(watcher, seen)
        after_back = _next_telemetry(watcher, seen + 1)
        agent_figures = after_back["agent"]
        assert isinstance(agent_figures, dict)
        assert isinstance(first["agent"], dict)
        assert agent_figures["uptime_s"] >= first["agent"]["uptime_s"]
        assert float(str(after_back["ts"])) < real() - STEP_S / 2  # the label follows the clock
        # Commands still run (sent without expires_at: the console's clock stepped too).
        assert watcher.ok("ping")["pong"] is True
        assert watcher.ok("get_status")["uptime_s"] >= agent_figures["uptime_s"]

        monkeypatch.setattr(time, "time", real)
        seen = len(watcher.on("telemetry"))
        _next_telemetry(watcher, seen)
        again = _next_telemetry(watcher, seen + 1)
        assert isinstance(again["agent"], dict)
        assert again["agent"]["uptime_s"] >= agent_figures["uptime_s"]
        assert watcher.ok("ping")["pong"] is True
    finally:
        monkeypatch.setattr(time, "time", real)
        agent.close()
