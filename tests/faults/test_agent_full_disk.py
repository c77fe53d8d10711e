"""An agent whose disks refuse writes at start still comes online and runs its pipelines.

A restore that raised something other than an operator's error (OpenVINO's own, on a full
cache disk) ended `edge-agent run` with a traceback before the box came online, and every
restart under systemd met the same record until the unit's start limit left it down.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from edge_agent.agent.pipelines import Pipelines
from edge_agent.comms.local_broker import LocalBroker
from tests.agent_kit import InProcessAgent, Watcher, write_config

_RESTORE_FAILED = "pipelines_restore_failed"


def test_a_restore_that_raises_leaves_the_agent_online_and_says_why(
    broker: LocalBroker,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(self: Pipelines) -> list[str]:
        raise RuntimeError("basic_ios::clear: iostream error")

    # A fault injected where no real one is left to find: the guard is for bugs not known.
    monkeypatch.setattr(Pipelines, "restore", broken)
    config = write_config(tmp_path / "agent.toml", port=broker.port, state=tmp_path / "state")
    watcher = Watcher(broker.port, "dev-1")
    agent = InProcessAgent(config)
    try:
        watcher.wait_state(lambda s: s["online"])
        assert watcher.ok("ping")["pong"] is True
        time.sleep(0.5)
        assert agent.thread.is_alive()
        said = [r for r in caplog.records if getattr(r, "event", None) == _RESTORE_FAILED]
        assert len(said) == 1
        assert said[0].levelno == logging.ERROR
        assert said[0].exc_info is not None, "a bug keeps its traceback"
    finally:
        watcher.close()
        agent.close()
