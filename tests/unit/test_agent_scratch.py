"""The agent's scratch folder in the state after a stop that cut a calibration short."""

from __future__ import annotations

from pathlib import Path

from edge_agent.agent.service import AgentService
from edge_agent.config.agent import load_agent_config
from tests.agent_kit import cache_dir, write_config


def test_agent_start_deletes_what_an_interrupted_calibration_left(tmp_path: Path) -> None:
    # A stop during a calibration skipped its cleanup (a daemon thread, 5 s to finish):
    # its FP32 and INT8 IRs stayed in state/tmp for good.
    state = tmp_path / "state"
    left = state / "tmp" / "calibrate-k2j4x9_q" / "out"
    left.mkdir(parents=True)
    (left / "model.bin").write_bytes(b"\0" * 4096)
    other = state / "tmp" / "notes.txt"  # not the agent's: it stays
    other.write_text("keep me")
    config = write_config(tmp_path / "agent.toml", port=1, state=state)
    env = {"EDGE_AGENT_CACHE": str(cache_dir())}
    service = AgentService(load_agent_config(config, env), env)
    try:
        assert [p.name for p in (state / "tmp").iterdir()] == ["notes.txt"]
    finally:
        service.outbox.close()
        service.commands.close()
