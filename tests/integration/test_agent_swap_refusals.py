"""swap_model refused by the agent: the answer says why, and nothing changes.

A refused swap must leave three things as they were: the pipeline runs on its model,
list_pipelines names that model, and the agent's record of the pipeline (what a restart
brings back) names it too. Before d59e722, a swap to an image model on an audio pipeline
recorded the new model and only then was refused by the handle: list_pipelines named a
model that was not running, and a restart would have tried the pipeline on that model,
failed, and lost it. These tests drive a real agent (on a thread) over a real mosquitto, with a WAV
of espeak-ng speech for the audio pipeline and an MJPEG camera for the video one.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_agent.comms.local_broker import LocalBroker
from edge_agent.infer import read_audio
from tests.agent_kit import InProcessAgent, Watcher, fleet, trusting_config, write_config
from tests.conftest import espeak, write_wav

DEVICE = "swap-dev"
RATE = 16000
AUDIO_S = 1800
"""The WAV's length. A WAV source is read as fast as the model goes (about 140 s of audio
a second on a 2-core AMX host), so the clip must outlast the test's commands by far:
swap_model is only taken by a pipeline that still runs. 1800 s lasts about 13 s there,
so a host three times faster still leaves the few commands seconds to spare (600 s left
about 4); the file is 58 MB."""


@pytest.fixture(scope="module")
def speech(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An utterance, then silence for the rest of AUDIO_S seconds, at the model's rate."""
    tmp = tmp_path_factory.mktemp("speech")
    said = read_audio(espeak("close the north gate now", tmp / "said.wav"), RATE)
    rest = np.zeros(AUDIO_S * RATE - len(said), np.float32)
    path = tmp / "long.wav"
    write_wav(path, np.concatenate([said, rest]), RATE)
    return path


@pytest.fixture
def watcher(broker: LocalBroker) -> Iterator[Watcher]:
    running = Watcher(broker.port, DEVICE)
    yield running
    running.close()


def _config(broker: LocalBroker, tmp_path: Path) -> Path:
    return write_config(
        tmp_path / "agent.toml", port=broker.port, device=DEVICE, state=tmp_path / "state"
    )


def _recorded(tmp_path: Path) -> dict[str, Any]:
    """The pipelines in the agent's record on disk: what a restart starts again."""
    record = json.loads((tmp_path / "state" / "agent" / "agent.json").read_text())
    pipelines: dict[str, Any] = record["pipelines"]
    return pipelines


def _listed(watcher: Watcher) -> list[tuple[str, str, str]]:
    listed = watcher.ok("list_pipelines")["pipelines"]
    return [(p["id"], p["model"], p["status"]) for p in listed]


def _refused(watcher: Watcher, pipeline: str, model: dict[str, str]) -> dict[str, Any]:
    """Send swap_model and return its error (failing the test if it was answered ok)."""
    answer = watcher.final(watcher.send("swap_model", {"id": pipeline, "model": model}))
    assert answer["status"] == "error", answer
    error: dict[str, Any] = answer["error"]
    return error


@pytest.mark.parametrize(
    "model",
    [
        # An image model: it used to be recorded, then refused by the pipeline's handle.
        {"name": "face-blazeface"},
        # An audio model: it used to be refused as "takes audio; pipeline runs video".
        {"name": "vad-silero", "hint": "latency"},
    ],
    ids=["image-model", "audio-model"],
)
def test_a_swap_on_an_audio_pipeline_is_refused_and_it_runs_on(
    broker: LocalBroker,
    tmp_path: Path,
    watcher: Watcher,
    speech: Path,
    model: dict[str, str],
) -> None:
    agent = InProcessAgent(_config(broker, tmp_path))
    try:
        watcher.wait_state(lambda s: s["online"])
        spec = {
            "id": "mic",
            "model": {"name": "vad-silero"},
            "source": {"type": "wav", "path": str(speech)},
        }
        assert watcher.ok("start_pipeline", {"spec": spec}, timeout=60)["status"] == "running"
        # The utterance's segment: the pipeline is past its start and reads the file.
        watcher.wait(lambda m: m.leaf == "results/mic", what="a speech result")
        recorded = _recorded(tmp_path)
        assert recorded["mic"]["model"]["name"] == "vad-silero"

        error = _refused(watcher, "mic", model)
        assert error["code"] == "model.incompatible", error
        assert "runs audio" in error["message"], error

        # The agent serves on; the pipeline is listed on the model it runs, still running,
        # and its record is untouched.
        assert _listed(watcher) == [("mic", "vad-silero", "running")]
        assert _recorded(tmp_path) == recorded
        assert not [e for e in watcher.events() if e["kind"] == "pipeline_failed"]

        assert watcher.ok("stop_pipeline", {"id": "mic"})["status"] == "stopped"
        assert _listed(watcher) == []
    finally:
        agent.close()


def test_a_swap_refused_at_once_on_a_video_pipeline_changes_nothing_a_restart_sees(
    broker: LocalBroker, tmp_path: Path, watcher: Watcher, camera: str
) -> None:
    # Every refusal Pipelines.swap makes before it touches the record. (The put-back after
    # a refusal by the handle itself is not reached over MQTT: the only refusal the
    # handle makes at once, an audio pipeline, is answered before it.)
    config = _config(broker, tmp_path)
    spec = {
        "id": "gate",
        "model": {"name": "face-blazeface"},
        "source": {"type": "stream", "url": camera},
    }
    agent = InProcessAgent(config)
    try:
        watcher.wait_state(lambda s: s["online"])
        assert watcher.ok("start_pipeline", {"spec": spec}, timeout=60)["status"] == "running"
        watcher.wait(lambda m: m.leaf == "results/gate", what="a first result")
        recorded = _recorded(tmp_path)
        assert recorded["gate"]["model"]["name"] == "face-blazeface"

        # Each is known before any compile, so the answer itself is the refusal.
        for model, code in [
            ({"name": "vad-silero"}, "model.incompatible"),
            ({"name": "person-ssdlite", "device": "TPU"}, "device.invalid"),
            ({"name": "no-such-model"}, "model.not_found"),
        ]:
            error = _refused(watcher, "gate", model)
            assert error["code"] == code, (model, error)
            assert _listed(watcher) == [("gate", "face-blazeface", "running")], model
            assert _recorded(tmp_path) == recorded, model

        # What runs is what is listed: results keep coming, all from the original model.
        refused = time.time()
        watcher.wait(
            lambda m: m.leaf == "results/gate" and m.at > refused, what="a result after them"
        )
        assert {m.json()["model"] for m in watcher.on("results/gate")} == {"face-blazeface"}
        kinds = {e["kind"] for e in watcher.events()}
        assert not kinds & {"model_swapped", "pipeline_failed"}, kinds
    finally:
        agent.close()

    # A restart brings back what ran: the same pipeline, on its original model.
    assert _recorded(tmp_path) == recorded
    restarted = time.time()
    agent = InProcessAgent(config)
    try:
        back = watcher.wait(
            lambda m: (
                m.leaf == "events"
                and m.at > restarted
                and m.json()["event"]["kind"] == "pipeline_started"
            ),
            what="the restored pipeline's start",
        )
        assert back.json()["event"]["pipeline"] == "gate"
        assert back.json()["event"]["detail"] == "model face-blazeface"
        result = watcher.wait(
            lambda m: m.leaf == "results/gate" and m.at > back.at,
            what="a result from the restored pipeline",
        ).json()
        assert result["model"] == "face-blazeface"
        assert _listed(watcher) == [("gate", "face-blazeface", "running")]
        assert watcher.ok("stop_pipeline", {"id": "gate"})["status"] == "stopped"
        assert _recorded(tmp_path) == {}
    finally:
        agent.close()


def test_a_deploy_of_an_audio_pipelines_model_restarts_it_on_the_new_version(
    broker: LocalBroker, tmp_path: Path, watcher: Watcher, speech: Path
) -> None:
    # An audio pipeline cannot swap between frames: its refusal (model.incompatible) came
    # after the store had activated the new version, and the deploy was answered failed
    # for a change that was made, the pipeline left on the old version.
    with fleet(broker.port, tmp_path / "fleet", [("vad-silero", "vad", 1),
                                                 ("vad-silero", "vad", 2)]) as f:  # fmt: skip
        config = trusting_config(f, broker.port, tmp_path, DEVICE)
        agent = InProcessAgent(config)
        try:
            watcher.wait_state(lambda s: s["online"])
            watcher.ok("deploy_model", {"name": "vad", "version": 1}, timeout=120)
            spec = {"id": "mic", "model": {"name": "vad"},
                    "source": {"type": "wav", "path": str(speech)}}  # fmt: skip
            watcher.ok("start_pipeline", {"spec": spec}, timeout=60)
            deployed = watcher.ok("deploy_model", {"name": "vad", "version": 2}, timeout=120)
            assert deployed["pipelines_swapped"] == ["mic"]
            assert _listed(watcher) == [("mic", "vad", "running")]
            [model] = [m for m in watcher.ok("get_status")["models"] if m["name"] == "vad"]
            assert model["version"] == 2  # what the restarted pipeline runs
            assert _recorded(tmp_path)["mic"]["model"]["name"] == "vad"  # still on the name
        finally:
            agent.close()
