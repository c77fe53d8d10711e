"""A cancel that comes too late is refused, and the job's answer says what it did.

Before, cancel at a deploy's "activate" stage was answered ok and the deploy's final
answer said command.cancelled, while the model went live and model_activated went out: a
console believed the box ran the old version. A deploy past its point of no return now
refuses the cancel (command.busy) and answers ok; a queued activate_model that was
cancelled never touches the store.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from edge_agent.agent.jobs import JobContext
from edge_agent.agent.models import ModelOps
from edge_agent.catalog.catalog import Catalog, default_models_dir
from edge_agent.clips import sample
from edge_agent.comms.local_broker import LocalBroker
from edge_agent.errors import EdgeAgentError
from edge_agent.paths import Layout
from edge_agent.protocol.agent import AgentEvent, DetectionEvent
from edge_agent.store.health import HealthGate, HealthReport
from edge_agent.store.release import Release
from edge_agent.store.store import ModelStore
from tests.agent_kit import (
    InProcessAgent,
    Watcher,
    cache_dir,
    fleet,
    photo_pipelines,
    trusting_config,
)
from tests.integration.store_kit import onnx_folder, release_for

DEVICE = "cancel-dev"


def test_a_cancel_at_the_activate_stage_is_refused_and_the_deploy_answers_ok(
    broker: LocalBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The health gate waits for the cancel's answer: with a warm compile cache the deploy
    # could otherwise end before the cancel came, and the cancel find nothing to refuse.
    cancel_answered = threading.Event()
    real_gate = HealthGate.__call__

    def gate_after_the_cancel(gate: HealthGate, model: Path, release: Release) -> HealthReport:
        assert cancel_answered.wait(60), "the cancel was never answered"
        return real_gate(gate, model, release)

    monkeypatch.setattr(HealthGate, "__call__", gate_after_the_cancel)
    with fleet(broker.port, tmp_path / "fleet", [("person-ssdlite", "person-det", 1)]) as f:
        config = trusting_config(f, broker.port, tmp_path, DEVICE)
        agent = InProcessAgent(config)
        w = Watcher(broker.port, DEVICE)
        try:
            w.wait_state(lambda s: s["online"])
            deploy = w.send("deploy_model", {"name": "person-det", "version": 1, "activate": True})
            w.wait(
                lambda m: (
                    m.leaf == "resp"
                    and (a := m.json()).get("id") == deploy
                    and a.get("progress", {}).get("stage") == "activate"
                ),
                60,
                "the activate stage",
            )
            refused = w.final(w.send("cancel", {"id": deploy}))
            cancel_answered.set()
            assert refused["status"] == "error", refused
            assert refused["error"]["code"] == "command.busy"
            assert "point of no return" in refused["error"]["message"]
            final = w.final(deploy, 60)
            assert final["status"] == "ok", final
            assert final["result"]["activated"] is True
            listed = w.ok("list_models")["installed"]
            assert [(m["name"], m["version"], m["current"]) for m in listed] == [
                ("person-det", 1, True)
            ]
        finally:
            w.close()
            agent.close()


def test_an_activate_cancelled_while_it_waited_leaves_the_store_as_it_was(
    tmp_path: Path,
) -> None:
    events: list[AgentEvent | DetectionEvent] = []
    pipelines, _ = photo_pipelines(tmp_path, cache_dir(), sample("astronaut"), events.append)
    try:
        store = pipelines.pool.catalog.store
        assert isinstance(store, ModelStore)
        ref = Catalog(default_models_dir(), cache_dir()).resolve("face-blazeface")
        for version in (1, 2):
            folder = onnx_folder(ref, tmp_path / f"v{version}")
            store.install(release_for("face", version, folder, ref.manifest, None), folder)
        store.activate("face", 1)
        ops = ModelOps(
            store,
            pipelines.pool.catalog,
            Layout(cache=cache_dir(), state=tmp_path / "state"),
            pipelines,
            events.append,
            [],
            DEVICE,
        )
        job = JobContext(lambda stage, fraction: None)
        assert job.request_cancel()  # cancelled while a deploy ran ahead of it
        with pytest.raises(EdgeAgentError) as raised:
            ops.activate("face", 2, job)
        assert raised.value.code == "command.cancelled"
        assert store.state("face").current == 1
        assert events == []
    finally:
        pipelines.close()
