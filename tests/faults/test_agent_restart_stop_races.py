"""A stop_pipeline during a deploy's restart of an audio pipeline: the stop wins, said so.

An audio pipeline cannot swap its model, so a deploy, an activation or a rollback stops it
and starts it again (`Pipelines._restart`). A stop_pipeline that came while the restart
compiled was announced as `pipeline_failed` ("restart on the new model failed: ... was
stopped while it started"); one that came during the restart's stop of a pipeline the
record does not hold was answered `pipeline.not_found`, and the restart ran the pipeline on
behind it. Each race is made certain by holding the restart at a seam (its stop of the
run, its build of the new one) until the stop_pipeline has answered; the pool, vad-silero,
the records and the microphone's `arecord` process (a fake one: there is no sound card
here, `tests/mic_kit.py`) are real.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from edge_agent.agent import pipelines as agent_pipelines
from edge_agent.agent.pipelines import Pipelines
from edge_agent.errors import EdgeAgentError
from edge_agent.pipelines.runner import PipelineHandle
from edge_agent.pipelines.spec import PipelineSpec
from edge_agent.protocol.agent import AgentEvent, DetectionEvent, PipelineState
from tests.agent_kit import photo_pipelines
from tests.mic_kit import fake_arecord

RECORDED = pytest.mark.parametrize("recorded", [True, False], ids=["recorded", "unrecorded"])


@pytest.fixture
def door(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A vad-silero pipeline on a microphone that stays quiet for the test's length."""
    raw = tmp_path / "silence.raw"
    raw.write_bytes(bytes(3200))  # 0.1 s of silence at 16 kHz, then nothing, still open
    fake_arecord(tmp_path / "bin", raw, tail="exec sleep 60", monkeypatch=monkeypatch)
    return {
        "id": "door",
        "model": {"name": "vad-silero"},
        "source": {"type": "mic", "stall_timeout_s": 60},
        "sinks": [],
    }


def _started(
    tmp_path: Path,
    cache_dir: Path,
    photo: npt.NDArray[np.uint8],
    spec: dict[str, Any],
    recorded: bool,
) -> tuple[Pipelines, list[AgentEvent | DetectionEvent]]:
    events: list[AgentEvent | DetectionEvent] = []
    pipelines, _ = photo_pipelines(tmp_path, cache_dir, photo, events.append)
    pipelines.start(spec, persist=recorded)
    assert ("door" in pipelines.records.record.pipelines) is recorded
    return pipelines, events


def _stopped_for_good(pipelines: Pipelines, events: list[AgentEvent | DetectionEvent]) -> None:
    """Nothing of the pipeline is left: not listed, not recorded, not running, and no event
    called the operator's stop a failure."""
    assert pipelines.states() == []
    assert pipelines.records.record.pipelines == {}
    assert pipelines.handles() == {}
    assert not [t.name for t in threading.enumerate() if t.name == "pipeline-door"]
    assert [e.kind for e in events if e.kind == "pipeline_failed"] == []
    said = [e.detail for e in events if e.kind == "pipeline_stopped"]
    assert said == ["stopped by command"], said


@RECORDED
def test_a_stop_during_the_restarts_stop_keeps_the_pipeline_stopped(
    tmp_path: Path,
    cache_dir: Path,
    astronaut: npt.NDArray[np.uint8],
    door: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
    recorded: bool,
) -> None:
    pipelines, events = _started(tmp_path, cache_dir, astronaut, door, recorded)
    real_stop = PipelineHandle.stop
    answers: list[PipelineState | EdgeAgentError] = []

    def stop_during_the_restarts_stop(handle: PipelineHandle) -> None:
        # The restart has taken the pipeline out of the running; its join is to come.
        if not answers:
            try:
                answers.append(pipelines.stop("door"))
            except EdgeAgentError as exc:
                answers.append(exc)
        real_stop(handle)

    monkeypatch.setattr(PipelineHandle, "stop", stop_during_the_restarts_stop)
    try:
        assert pipelines.reload_model("vad-silero") == []
        [answer] = answers
        assert isinstance(answer, PipelineState), answer
        assert (answer.id, answer.model, answer.status) == ("door", "vad-silero", "stopped")
        _stopped_for_good(pipelines, events)
    finally:
        monkeypatch.undo()
        pipelines.close()


@RECORDED
def test_a_stop_during_the_restarts_build_is_no_failed_restart(
    tmp_path: Path,
    cache_dir: Path,
    astronaut: npt.NDArray[np.uint8],
    door: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
    recorded: bool,
) -> None:
    pipelines, events = _started(tmp_path, cache_dir, astronaut, door, recorded)
    building, release = threading.Event(), threading.Event()

    def held(spec: PipelineSpec, *args: Any, **kwargs: Any) -> PipelineHandle:
        # The restart's compile of the new version, on the deploy's thread.
        if threading.current_thread().name == "deploy":
            building.set()
            assert release.wait(30), "the test never let the restart go on"
        return PipelineHandle(spec, *args, **kwargs)

    monkeypatch.setattr(agent_pipelines, "PipelineHandle", held)
    moved: list[list[str]] = []
    deploy = threading.Thread(
        target=lambda: moved.append(pipelines.reload_model("vad-silero")), name="deploy"
    )
    try:
        deploy.start()
        assert building.wait(30)
        answer = pipelines.stop("door")  # while the restart builds it again
        assert (answer.id, answer.status) == ("door", "stopped")
        release.set()
        deploy.join(30)
        assert not deploy.is_alive()

        assert moved == [[]]  # the deploy's answer names no pipeline restarted on it
        _stopped_for_good(pipelines, events)
    finally:
        release.set()
        pipelines.close()


@RECORDED
def test_a_stop_just_before_the_restart_is_no_failed_restart(
    tmp_path: Path,
    cache_dir: Path,
    astronaut: npt.NDArray[np.uint8],
    door: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
    recorded: bool,
) -> None:
    # The deploy found the pipeline running; the stop_pipeline came before its restart's
    # own stop, which then found nothing to stop and said the restart had failed.
    pipelines, events = _started(tmp_path, cache_dir, astronaut, door, recorded)
    swaps = pipelines._swaps
    real_restart = swaps._restart
    answers: list[PipelineState] = []

    def stop_first(entry: Any) -> bool:
        answers.append(pipelines.stop("door"))
        return real_restart(entry)

    monkeypatch.setattr(swaps, "_restart", stop_first)
    try:
        assert pipelines.reload_model("vad-silero") == []
        assert [(a.id, a.status) for a in answers] == [("door", "stopped")]
        _stopped_for_good(pipelines, events)
    finally:
        pipelines.close()
