"""The agent's full loop on a real mosquitto, on MQTT 5 and on 3.1.1.

A fleet publishes person-ssdlite (as `person-det`, signed) with edge-fleet's own
code; the agent deploys it over MQTT, runs a pipeline on the walk video, reports
results, Frigate-shaped detection events and telemetry, hot-swaps the model while
the video plays, and stops the pipeline. The agent runs on a thread here: these
tests are about the protocol; the process tests are in tests/faults/test_agent_*.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from edge_agent.agent.loaded import TrackedPool
from edge_agent.catalog.catalog import Catalog, ResolvedModel, default_models_dir
from edge_agent.clips import WalkVideo, write_walk
from edge_agent.comms.held_filters import HeldFilters
from edge_agent.comms.local_broker import LocalBroker
from edge_agent.paths import Layout
from edge_agent.runtime.base import RuntimeOptions
from edge_agent.store.store import ModelStore
from tests.agent_kit import InProcessAgent, Watcher, cache_dir, fleet, trusting_config
from tests.integration.store_kit import ir_folder, onnx_folder, release_for

DEVICE = "dock-7"


@pytest.fixture(scope="module")
def walk(tmp_path_factory: pytest.TempPathFactory) -> WalkVideo:
    # 150 frames: the person walks in, lingers, walks out, twice over (about 3-6 s of
    # inference here), long enough for a swap to land mid-video.
    folder = tmp_path_factory.mktemp("walk")
    return write_walk(folder / "walk.avi", empty=10, crossing=20, frames=150)


@pytest.fixture
def watcher(broker: LocalBroker) -> Iterator[Watcher]:
    running = Watcher(broker.port, DEVICE)
    yield running
    running.close()


@pytest.mark.parametrize("mqtt_version", ["5", "3.1.1"])
def test_full_loop(
    broker: LocalBroker, tmp_path: Path, walk: WalkVideo, watcher: Watcher, mqtt_version: str
) -> None:
    with fleet(broker.port, tmp_path / "fleet", [("person-ssdlite", "person-det", 1)]) as f:
        extra = 'group = "docks"'
        config = trusting_config(
            f, broker.port, tmp_path, DEVICE, version=mqtt_version, extra=extra
        )
        agent = InProcessAgent(config)
        try:
            _loop(watcher, walk, mqtt_version)
        finally:
            agent.close()
    # What its persistent session holds is on disk for the next process (which lets go of
    # what it does not subscribe again: tests/integration/test_comms.py).
    held = set(HeldFilters(tmp_path / "state" / "agent" / "mqtt-filters.json").load())
    assert {f"edge/v1/{DEVICE}/cmd", "edge/v1/group/docks/cmd", f"edge/v1/{DEVICE}/state"} <= held
    # A clean stop says offline, with the same seq as the birth, and the version, group
    # and config the box ran: a dark box is still known by what it ran.
    births = [m.json() for m in watcher.on("state") if m.json()["online"]]
    last = watcher.on("state")[-1].json()
    assert last == {
        "online": False,
        "seq": births[-1]["seq"],
        "ts": last["ts"],
        "agent_version": births[-1]["agent_version"],
        "agent_build": births[-1]["agent_build"],
        "group": "docks",
        "config_hash": births[-1]["config_hash"],
    }
    # The will's own bytes, made at the connect: a console dates any offline state as its
    # connection's start, which a stop stamped with its own time was not.
    assert last["ts"] <= births[-1]["ts"]


def _loop(watcher: Watcher, walk: WalkVideo, mqtt_version: str) -> None:
    birth = watcher.wait_state(lambda s: s["online"])
    assert birth["mqtt_version"] == mqtt_version
    assert "CPU" in birth["devices"]
    assert birth["unverified"] is False
    # A command to the device's group reaches it; it answers on its own topic.
    watcher.session.publish(
        "edge/v1/group/docks/cmd",
        json.dumps({"id": "group-ping", "type": "ping", "sent_at": time.time()}).encode(),
    )
    assert watcher.final("group-ping")["result"]["pong"] is True

    # Deploy: accepted, progress through the stages, then ok; activated behind the gate.
    deploy = watcher.send("deploy_model", {"name": "person-det", "version": 1})
    done = watcher.final(deploy, timeout=90)
    assert done["status"] == "ok", done
    assert done["result"]["installed"]
    assert done["result"]["activated"]
    kinds = [a["status"] for a in watcher.answers(deploy)]
    assert kinds[0] == "accepted"
    assert kinds[-1] == "ok"
    assert "progress" in kinds
    stages = [a["progress"]["stage"] for a in watcher.answers(deploy) if a["status"] == "progress"]
    assert {"release", "transfer", "activate"} <= set(stages)
    watcher.wait_event(lambda e: e["kind"] == "model_activated" and e["model"] == "person-det")
    listed = watcher.ok("list_models")
    assert [(m["name"], m["version"], m["current"]) for m in listed["installed"]] == [
        ("person-det", 1, True)
    ]

    # Run it on the walk video, swap to the reference model while it plays.
    spec = {
        "id": "cam",
        "model": {"name": "person-det"},
        "source": {"type": "file", "path": str(walk.path)},
    }
    started = watcher.ok("start_pipeline", {"spec": spec}, timeout=60)
    assert started["status"] == "running"
    watcher.wait(lambda m: m.leaf == "results/cam", timeout=30, what="a first result")
    swapped = watcher.ok("swap_model", {"id": "cam", "model": {"name": "person-ssdlite"}})
    assert swapped["model"] == "person-ssdlite"
    watcher.wait_event(lambda e: e["kind"] == "model_swapped", timeout=30)
    watcher.wait_event(
        lambda e: e["kind"] == "pipeline_stopped" and e["pipeline"] == "cam", timeout=60
    )

    # Results: only frames with detections (the default policy), in order, both models.
    results = [m.json() for m in watcher.on("results/cam")]
    frames = [r["frame"] for r in results]
    assert frames == sorted(set(frames))
    assert all(r["results"] for r in results)
    assert sum(walk.visible) * 0.5 <= len(results) <= walk.frames
    models = [r["model"] for r in results]
    assert models[0] == "person-det"
    assert models[-1] == "person-ssdlite"
    assert models == sorted(models, key=lambda m: m == "person-ssdlite")  # one switch

    # Detection events in Frigate's shape: each object new, then updates, then end.
    detections = [e for e in watcher.events() if e["kind"] == "detection"]
    assert detections, "no detection events"
    by_id: dict[str, list[dict[str, object]]] = {}
    for event in detections:
        by_id.setdefault(str(event["id"]), []).append(event)
    for track in by_id.values():
        assert track[0]["type"] == "new"
        assert track[-1]["type"] == "end"
        assert {e["label"] for e in track} == {"person"}
        end = track[-1]
        assert isinstance(end["end_time"], float)
        assert isinstance(end["start_time"], float)
        assert end["start_time"] <= end["end_time"]
        assert len(end["box"]) == 4  # type: ignore[arg-type]
    # The person crosses twice with an empty stretch between: two objects, not one per frame.
    assert 1 <= len(by_id) <= 4

    # Telemetry: per pipeline stage percentiles, per model device and latency, the agent.
    # Figures are per interval: one that fell while the model compiled rightly carries the
    # pipeline with no frames; take one that saw it work (the tick after the file ended
    # carries its last interval, however short the run was).
    telemetry = watcher.wait(
        lambda m: (
            m.leaf == "telemetry" and m.json()["pipelines"].get("cam", {}).get("frames", 0) > 0
        ),
        timeout=10,
        what="telemetry with the pipeline",
    ).json()
    assert telemetry["schema"] == 1
    cam = telemetry["pipelines"]["cam"]
    assert cam["fps"] > 0
    assert cam["frames"] > 0
    infer = cam["stages"]["infer"]
    assert 0 < infer["p50_ms"] <= infer["p95_ms"] <= infer["p99_ms"] <= infer["max_ms"]
    (model,) = telemetry["models"].values()
    assert model["device"].startswith("CPU")
    assert model["inferences"] > 0
    agent = telemetry["agent"]
    assert agent["rss_bytes"] > 50_000_000
    assert agent["reconnects"] == 0
    assert 0 < agent["cpu_cores"] <= len(os.sched_getaffinity(0))  # what cpu_percent is out of

    # The retained state follows: the model with its device, the pipeline.
    state = watcher.wait_state(
        lambda s: s["online"] and any(p["id"] == "cam" for p in s["pipelines"])
    )
    assert any(m["name"] == "person-det" and m["version"] == 1 for m in state["models"])

    # Stop it: forgotten, reported, and gone from the list.
    stopped = watcher.ok("stop_pipeline", {"id": "cam"})
    assert stopped["status"] == "stopped"
    watcher.wait_event(lambda e: e["kind"] == "pipeline_stopped" and "command" in e["detail"])
    assert watcher.ok("list_pipelines") == {"pipelines": []}


def test_a_running_model_name_gets_the_newly_activated_version(
    tmp_path: Path, resolve: Callable[[str], ResolvedModel]
) -> None:
    # deploy/activate/rollback swap running pipelines to "what the name resolves to now";
    # the pool must then compile the new version, not hand back the old one it holds.
    orientation = resolve("text-orientation")
    layout = Layout(cache=cache_dir(), state=tmp_path / "state")
    store = ModelStore(layout)
    for version, folder in ((1, onnx_folder(orientation, tmp_path / "onnx")), (2, None)):
        source = folder or ir_folder(orientation, tmp_path / "ir")
        store.install(release_for("orient", version, source, orientation.manifest, None), source)
    store.activate("orient", 1)
    pool = TrackedPool(Catalog(default_models_dir(), cache_dir(), store))
    options = RuntimeOptions(cache_dir=cache_dir())
    first, _ = pool.acquire("orient", "openvino", options)
    store.activate("orient", 2)
    second, resolved = pool.acquire("orient", "openvino", options)
    try:
        assert second is not first
        assert resolved.path.name == "model.xml"
        assert set(pool.reports()) == {"orient"}
    finally:
        pool.release(first)
        pool.release(second)
    assert pool.reports() == {}
