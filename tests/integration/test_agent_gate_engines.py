"""The agent's health gate vets a new version on every engine its pipelines run it on.

The gate once compiled every release on OpenVINO, on the agent's own device, whatever
the pipelines on that model ran: a version ONNX Runtime cannot load (an IR) passed, was
activated, and every ONNX Runtime pipeline on it failed its swap, then failed to start
after a restart. Real agent, real mosquitto, a fleet publishing signed releases, real
engines in the gate's child processes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from edge_agent.catalog.catalog import ResolvedModel
from edge_agent.clips import write_walk
from edge_agent.comms.local_broker import LocalBroker
from edge_agent.fleet.publish import publish_release
from edge_agent.protocol.topics import Topics
from tests.agent_kit import Fleet, InProcessAgent, Watcher, fleet, trusting_config
from tests.integration.store_kit import ir_folder, onnx_folder, release_for

DEVICE = "box-3"


@pytest.fixture
def watcher(broker: LocalBroker) -> Iterator[Watcher]:
    running = Watcher(broker.port, DEVICE)
    yield running
    running.close()


def _publish(f: Fleet, version: int, folder: Path, orientation: ResolvedModel) -> None:
    signed = release_for("orient", version, folder, orientation.manifest, f.key)
    publish_release(f.session, Topics(), f.server.repo, signed, folder)
    assert f.session.flush(10.0)


def _spec(pipeline: str, video: Path, backend: str) -> dict[str, Any]:
    # Looped at 2 FPS: the pipeline runs the model for as long as the test looks.
    source = {"type": "file", "path": str(video), "realtime": True, "loop": True, "fps_cap": 2}
    return {"id": pipeline, "model": {"name": "orient", "backend": backend}, "source": source}


def test_a_version_one_engine_of_the_running_pipelines_cannot_load_fails_the_gate(
    broker: LocalBroker,
    tmp_path: Path,
    watcher: Watcher,
    resolve: Callable[[str], ResolvedModel],
) -> None:
    orientation = resolve("text-orientation")
    video = write_walk(tmp_path / "walk.avi", empty=2, crossing=2, frames=8).path
    with fleet(broker.port, tmp_path / "fleet", [("text-orientation", "orient", 1)]) as f:
        config = trusting_config(f, broker.port, tmp_path, DEVICE)
        agent = InProcessAgent(config)
        try:
            watcher.wait_state(lambda s: s["online"])
            assert watcher.ok("deploy_model", {"name": "orient", "version": 1}, 90)["activated"]
            for pipeline, backend in (("ort", "onnxruntime"), ("ov", "openvino")):
                watcher.ok("start_pipeline", {"spec": _spec(pipeline, video, backend)}, 60)

            # v2 is the same model as an IR: OpenVINO runs it, ONNX Runtime cannot load it.
            _publish(f, 2, ir_folder(orientation, tmp_path / "v2"), orientation)
            answer = watcher.final(watcher.send("deploy_model", {"name": "orient"}), 120)
            assert answer["status"] == "error", answer
            assert answer["error"]["code"] == "health.failed"
            assert (
                "orient v2 failed the health gate on onnxruntime CPU"
                in (answer["error"]["message"])
            )
            watcher.wait_event(lambda e: e["kind"] == "model_health_failed" and e["version"] == 2)
            # v1 keeps serving both pipelines.
            installed = watcher.ok("list_models")["installed"]
            assert [(m["version"], m["current"]) for m in installed] == [(1, True), (2, False)]
            pipelines = watcher.ok("list_pipelines")["pipelines"]
            assert {(p["id"], p["status"]) for p in pipelines} == {
                ("ort", "running"),
                ("ov", "running"),
            }

            # v3, ONNX again: both engines load it, so it passes on both and serves.
            _publish(f, 3, onnx_folder(orientation, tmp_path / "v3"), orientation)
            done = watcher.ok("deploy_model", {"name": "orient", "version": 3}, 120)
            assert done["activated"]
            assert sorted(done["pipelines_swapped"]) == ["ort", "ov"]
        finally:
            agent.close()
