"""The retained state reports every compile of a model, so a device fallback never hides.

Two pipelines on one model hold two compiles when their device or engine differ. The
state once kept one report per model name, the latest compile's: a pipeline that fell
back from its GPU to the CPU was hidden as soon as another pipeline compiled the same
model on the CPU or on ONNX Runtime, and the fleet's `fallback` flag went with it. Real
agent, real mosquitto, real engines; the GPU is missing on this machine, so OpenVINO
really falls back from it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edge_agent.clips import write_walk
from edge_agent.comms.base import Message
from edge_agent.comms.local_broker import LocalBroker
from edge_agent.fleet.roster import Roster
from edge_agent.fleet.tables import status_json
from edge_agent.fleet.trouble import device_flags
from edge_agent.protocol.topics import Topics
from tests.agent_kit import InProcessAgent, Watcher, retained_state, write_config

DEVICE = "box-2"
MODEL = "text-orientation"  # ONNX: both engines load it


@pytest.fixture
def watcher(broker: LocalBroker) -> Iterator[Watcher]:
    running = Watcher(broker.port, DEVICE)
    yield running
    running.close()


def _spec(pipeline: str, video: Path, model: dict[str, Any]) -> dict[str, Any]:
    # Looped at 2 FPS: the pipeline keeps its model for as long as the test looks.
    source = {"type": "file", "path": str(video), "realtime": True, "loop": True, "fps_cap": 2}
    return {"id": pipeline, "model": {"name": MODEL, **model}, "source": source}


def test_a_fallback_stays_in_the_state_when_another_pipeline_compiles_the_model_later(
    broker: LocalBroker, tmp_path: Path, watcher: Watcher
) -> None:
    video = write_walk(tmp_path / "walk.avi", empty=2, crossing=2, frames=8).path
    config = write_config(tmp_path / "agent.toml", port=broker.port, device=DEVICE, state=tmp_path)
    agent = InProcessAgent(config)
    try:
        watcher.wait_state(lambda s: s["online"])
        # A asks for the GPU first and falls back to the CPU; B, started after it, runs the
        # same model on ONNX Runtime.
        watcher.ok("start_pipeline", {"spec": _spec("a", video, {"device": "GPU,CPU"})}, 60)
        watcher.ok("start_pipeline", {"spec": _spec("b", video, {"backend": "onnxruntime"})}, 60)

        def both(state: dict[str, Any]) -> bool:
            return len([m for m in state["models"] if m["name"] == MODEL and m.get("device")]) == 2

        watcher.wait_state(both, timeout=20)
        state = retained_state(broker.port, DEVICE)
        loaded = sorted(
            (m["backend"], m["device"], m.get("fallback", ""))
            for m in state["models"]
            if m["name"] == MODEL and m.get("device")
        )
        assert [(b, d) for b, d, _ in loaded] == [("onnxruntime", "CPU"), ("openvino", "CPU")]
        assert loaded[0][2] == ""
        assert loaded[1][2].startswith("GPU: ")  # A's fallback, with its reason
        # The fleet console reads it as a fallback, and shows which engine runs what.
        roster = Roster(Topics())
        topic = Topics().device(DEVICE, "state")
        roster.on_state(Message(topic, json.dumps(state).encode(), retain=True))
        [record] = roster.snapshot()
        assert "fallback" in device_flags(record)
        [entry] = status_json([record])
        assert {m.get("backend") for m in entry["models"] if m.get("device")} == {
            "openvino",
            "onnxruntime",
        }
    finally:
        agent.close()
