"""A second agent on a state folder another agent serves is refused, naming the first.

Two agents on one state share a device id, a record, an outbox and a command log: the
broker hands their one client id back and forth, both restore the recorded pipelines,
and both send the outbox. Real agent processes on the suite's mosquitto.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edge_agent.agent.instance import hold_state
from edge_agent.comms.local_broker import LocalBroker
from edge_agent.errors import EdgeAgentError
from edge_agent.paths import Layout
from tests.agent_kit import REPO, AgentProcess, Watcher, cache_dir, write_config

DEVICE = "twice-dev"


def test_a_second_agent_on_the_same_state_is_refused_and_a_killed_one_keeps_none_out(
    broker: LocalBroker, tmp_path: Path
) -> None:
    config = write_config(
        tmp_path / "agent.toml", port=broker.port, device=DEVICE, state=tmp_path / "state"
    )
    watcher = Watcher(broker.port, DEVICE)
    first = AgentProcess(config, tmp_path / "first.log").start()
    third = AgentProcess(config, tmp_path / "third.log")
    try:
        birth = watcher.wait_state(lambda s: s["online"], timeout=60)
        env = {**os.environ, "EDGE_AGENT_CACHE": str(cache_dir())}
        second = subprocess.run(
            [sys.executable, "-m", "edge_agent", "run", "--config", str(config)],
            capture_output=True,
            text=True,
            env=env,
            cwd=REPO,
            timeout=60,
        )
        assert second.returncode != 0
        assert second.stderr.splitlines() == [
            f"edge-agent: error: another edge-agent (pid {first.pid}) runs on the state "
            f"folder {tmp_path / 'state'}; stop it first (systemctl stop edge-agent), or "
            "give this one its own state_dir [agent.running]"
        ], second.stderr
        # It never connected: the first is still the one online, on its first connection.
        assert watcher.ok("ping")
        assert watcher.wait_state(lambda s: True)["seq"] == birth["seq"]
        # The kernel drops a killed agent's hold: the next one starts.
        first.kill()
        third.start()
        reborn = watcher.wait_state(lambda s: s["online"] and s["seq"] > birth["seq"], 60)
        assert reborn["online"]
        assert third.stop() == 0
    finally:
        first.close()
        third.close()
        watcher.close()


def test_a_state_disk_that_refuses_the_lock_file_does_not_keep_the_agent_from_serving(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A state disk remounted read-only after an error: the agent serves from memory, as its
    # records and outbox do. Here the lock file cannot be opened for writing (a folder is in
    # its place), which fails as a read-only disk's open does (as root, permissions do not).
    layout = Layout(cache=tmp_path / "cache", state=tmp_path / "state")
    layout.agent_lock.mkdir(parents=True)
    caplog.set_level(logging.WARNING, logger="edge_agent.agent.instance")
    first = hold_state(layout, wait_s=0.0)
    second = hold_state(layout, wait_s=0.0)  # not kept out: there is no lock to hold
    first.release()
    second.release()
    said = [r.getMessage() for r in caplog.records]
    assert said == ["agent_lock_unavailable", "agent_lock_unavailable"]
    # Where the file can be made, the second is kept out, naming the first.
    ok = Layout(cache=tmp_path / "cache", state=tmp_path / "ok")
    held = hold_state(ok, wait_s=0.0)
    with pytest.raises(EdgeAgentError) as refused:
        hold_state(ok, wait_s=0.0)
    assert refused.value.code == "agent.running"
    assert f"(pid {os.getpid()})" in str(refused.value)
    held.release()
    hold_state(ok, wait_s=0.0).release()  # and let in once the first lets go
