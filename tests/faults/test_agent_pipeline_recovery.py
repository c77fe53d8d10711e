"""A pipeline that fails once comes back by itself, and a stop is never said as a failure.

Each fault here once left a box short of a pipeline until an operator stopped and started it
again by hand, which across a fleet means per box. The faults are injected where the agent
builds or runs a pipeline (a build that raises once, as OpenVINO does on a full cache disk; a
run or an emitter that raises once); everything around them is real: an MJPEG camera over
HTTP, the agent's pipeline manager, its record, the pool and face-blazeface.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from edge_agent.agent import pipelines as agent_pipelines
from edge_agent.agent.pipelines import Pipelines
from edge_agent.agent.specs import checked_spec
from edge_agent.clips import write_walk
from edge_agent.errors import EdgeAgentError
from edge_agent.pipelines.runner import PipelineHandle
from edge_agent.pipelines.spec import PipelineSpec
from edge_agent.pipelines.vision import VisionPipeline
from edge_agent.protocol.agent import AgentEvent, DetectionEvent
from tests.agent_kit import photo_pipelines
from tests.conftest import write_wav
from tests.integration.mjpeg_server import MjpegServer, free_port

Event = AgentEvent | DetectionEvent


@pytest.fixture
def camera(astronaut: npt.NDArray[np.uint8]) -> Iterator[MjpegServer]:
    server = MjpegServer(np.ascontiguousarray(astronaut[:, :, ::-1]), free_port(), fps=10)
    server.start()
    yield server
    server.stop()


def live(spec: dict[str, Any], camera: MjpegServer, pipeline_id: str = "cam") -> dict[str, Any]:
    return {**spec, "id": pipeline_id, "source": {"type": "stream", "url": camera.url}}


def runs_again(pipelines: Pipelines, pipeline_id: str, timeout: float = 30.0) -> None:
    """Wait until `pipeline_id` runs and has made frames."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        handle = pipelines.handles().get(pipeline_id)
        if handle is not None and handle.telemetry.snapshot().frames > 0:
            return
        time.sleep(0.1)
    raise AssertionError(f"{pipeline_id} never ran again: {pipelines.states()}")


def failing_once(make: Callable[..., PipelineHandle]) -> Callable[..., PipelineHandle]:
    """A PipelineHandle whose first build raises as OpenVINO does on a full cache disk."""
    left = [1]

    def build(*args: Any, **kwargs: Any) -> PipelineHandle:
        if left[0]:
            left[0] -= 1
            raise RuntimeError("basic_ios::clear: iostream error")
        return make(*args, **kwargs)

    return build


def test_a_recorded_camera_whose_build_fails_at_start_is_retried(
    tmp_path: Path,
    cache_dir: Path,
    astronaut: npt.NDArray[np.uint8],
    camera: MjpegServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Listed "not started from its record" for good: a fleet-wide full disk at boot left
    # every box without its cameras until each was stopped and started again by hand.
    events: list[Event] = []
    pipelines, spec = photo_pipelines(tmp_path, cache_dir, astronaut, events.append)
    monkeypatch.setattr(agent_pipelines, "PipelineHandle", failing_once(PipelineHandle))
    try:
        pipelines.records.update(pipelines={"cam": live(spec, camera)})
        assert pipelines.restore() == []
        [state] = pipelines.states()
        assert state.status == "failed"
        assert "retried" in state.detail
        failed = [e for e in events if e.kind == "pipeline_failed"]
        assert [(e.pipeline, e.code) for e in failed if isinstance(e, AgentEvent)] == [
            ("cam", "internal")
        ]
        runs_again(pipelines, "cam")
        assert "cam" in pipelines.records.record.pipelines
    finally:
        pipelines.close()


def test_a_spec_this_build_refuses_is_listed_not_retried(
    tmp_path: Path,
    cache_dir: Path,
    astronaut: npt.NDArray[np.uint8],
    camera: MjpegServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A model whose head the build refuses does not pass with time: listed, for a stop.
    pipelines, spec = photo_pipelines(tmp_path, cache_dir, astronaut, lambda _: None)

    def refused(*args: Any, **kwargs: Any) -> PipelineHandle:
        raise EdgeAgentError("not a detector", "use another model", code="model.incompatible")

    monkeypatch.setattr(agent_pipelines, "PipelineHandle", refused)
    try:
        pipelines.records.update(pipelines={"cam": live(spec, camera)})
        assert pipelines.restore() == []
        [state] = pipelines.states()
        assert state.status == "failed"
        assert "not started from its record" in state.detail
        assert pipelines.handles() == {}
    finally:
        pipelines.close()


@pytest.mark.parametrize("where", ["run", "emitter"])
def test_a_camera_whose_run_crashes_once_is_retried(
    tmp_path: Path,
    cache_dir: Path,
    astronaut: npt.NDArray[np.uint8],
    camera: MjpegServer,
    monkeypatch: pytest.MonkeyPatch,
    where: str,
) -> None:
    # A crash out of the run was never retried; one in the emitter ended the run with no
    # error, said "source ended" as a file that played out, and was never retried either.
    events: list[Event] = []
    failed = threading.Event()

    def on_event(event: Event) -> None:
        events.append(event)
        if event.kind == "pipeline_failed":
            failed.set()

    pipelines, spec = photo_pipelines(tmp_path, cache_dir, astronaut, on_event)
    owner: Any = PipelineHandle if where == "run" else VisionPipeline
    method = "run" if where == "run" else "_drain"
    real = getattr(owner, method)
    left = [1]

    def once(self: Any) -> Any:
        if left[0]:
            left[0] -= 1
            raise ZeroDivisionError("a one-off bug")
        return real(self)

    monkeypatch.setattr(owner, method, once)
    try:
        pipelines.start(live(spec, camera), persist=False)
        assert failed.wait(30), f"no pipeline_failed: {events}"
        [said] = [e for e in events if e.kind == "pipeline_failed"]
        assert isinstance(said, AgentEvent)
        assert said.code == "internal"
        assert "a one-off bug" in said.detail
        assert not [e for e in events if e.kind == "pipeline_stopped"]
        runs_again(pipelines, "cam")
    finally:
        pipelines.close()


def test_a_stop_while_the_restore_builds_the_pipeline_is_not_said_as_a_failure(
    tmp_path: Path,
    cache_dir: Path,
    astronaut: npt.NDArray[np.uint8],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A stop_pipeline the broker held for the box arrives as the restore builds the very
    # pipeline: answered stopped, it was then said failed (command.cancelled) as well.
    events: list[Event] = []
    pipelines, spec = photo_pipelines(tmp_path, cache_dir, astronaut, events.append)
    building, release = threading.Event(), threading.Event()

    def held(*args: Any, **kwargs: Any) -> PipelineHandle:
        building.set()
        release.wait(30)
        return PipelineHandle(*args, **kwargs)

    monkeypatch.setattr(agent_pipelines, "PipelineHandle", held)
    restored: list[list[str]] = []
    restoring = threading.Thread(target=lambda: restored.append(pipelines.restore()))
    try:
        pipelines.records.update(pipelines={"cam": spec})
        restoring.start()
        assert building.wait(30)
        assert pipelines.stop("cam").status == "stopped"
        release.set()
        restoring.join(30)
        assert restored == [[]]
        assert [e.kind for e in events if e.pipeline == "cam"] == ["pipeline_stopped"]
        assert pipelines.states() == []
    finally:
        release.set()
        pipelines.close()


def test_a_pipeline_held_over_the_cap_takes_the_room_a_failed_restart_frees(
    tmp_path: Path,
    cache_dir: Path,
    astronaut: npt.NDArray[np.uint8],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Only a stop_pipeline started a held pipeline: a deploy whose restart of a file
    # pipeline failed freed its slot, and the held one said "starts as soon as a
    # stop_pipeline makes room" with room free, until the next reboot.
    pipelines, spec = photo_pipelines(tmp_path, cache_dir, astronaut, lambda _: None)
    pipelines.max_running = 1
    video = write_walk(tmp_path / "walk.avi", empty=2, crossing=2, frames=8).path
    source = {"type": "file", "path": str(video), "realtime": True, "loop": True, "fps_cap": 5}
    looping = {**spec, "source": source}
    try:
        pipelines.records.update(
            pipelines={"a": {**looping, "id": "a"}, "b": {**looping, "id": "b"}}
        )
        assert pipelines.restore() == ["a"]
        assert {s.id: s.status for s in pipelines.states()} == {"a": "running", "b": "failed"}

        def broken(spec: PipelineSpec, *args: Any, **kwargs: Any) -> PipelineHandle:
            if spec.id == "a":
                raise EdgeAgentError("version 2 does not compile", code="model.corrupt")
            return PipelineHandle(spec, *args, **kwargs)

        monkeypatch.setattr(agent_pipelines, "PipelineHandle", broken)
        assert pipelines._restart(pipelines._roster.running["a"]) is False
        runs_again(pipelines, "b")
    finally:
        pipelines.close()


def test_an_audio_pipeline_starting_as_its_model_changes_restarts_on_the_new_one(
    tmp_path: Path,
    cache_dir: Path,
    astronaut: npt.NDArray[np.uint8],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A deploy during the build flagged it, and listed it as moved; only a video pipeline
    # acted on the flag, and the audio one ran the version it had resolved until a reboot.
    events: list[Event] = []
    pipelines, _ = photo_pipelines(tmp_path, cache_dir, astronaut, events.append)
    wav = tmp_path / "quiet.wav"
    write_wav(wav, np.zeros(16000 * 60, dtype=np.float32), 16000)
    building, release = threading.Event(), threading.Event()
    builds: list[str] = []

    def held(*args: Any, **kwargs: Any) -> PipelineHandle:
        handle = PipelineHandle(*args, **kwargs)  # resolved and compiled: the old version
        builds.append("built")
        if len(builds) == 1:
            building.set()
            release.wait(30)
        return handle

    monkeypatch.setattr(agent_pipelines, "PipelineHandle", held)
    audio = {
        "id": "talk",
        "model": {"name": "vad-silero"},
        "source": {"type": "wav", "path": str(wav)},
    }
    starting = threading.Thread(target=lambda: pipelines.start(audio, persist=False))
    try:
        starting.start()
        assert building.wait(60)
        assert pipelines.reload_model("vad-silero") == ["talk"]
        release.set()
        starting.join(30)
        deadline = time.monotonic() + 30
        while len(builds) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(builds) == 2, "the audio pipeline was not restarted on the new model"
    finally:
        release.set()
        pipelines.close()


@pytest.mark.parametrize("pipeline_id", [".", ".."])
def test_a_pipeline_id_that_is_a_folder_step_is_refused(pipeline_id: str, tmp_path: Path) -> None:
    # `..` named its captures folder state/captures/..: the state folder's root, where a
    # capture sink wrote its frames beside the agent's record.
    source = {"type": "folder", "path": str(tmp_path)}
    spec = {"id": pipeline_id, "model": {"name": "face-blazeface"}, "source": source}
    with pytest.raises(EdgeAgentError, match="is not a pipeline id") as caught:
        checked_spec(spec, tmp_path, [])
    assert caught.value.code == "command.invalid"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"sinks": [{"type": "jsonl", "path": "a\x00b.jsonl"}]}, "args.spec.sinks.0.path"),
        ({"sinks": [{"type": "snapshot", "folder": "x\x00"}]}, "args.spec.sinks.0.folder"),
        ({"source": {"type": "folder", "path": "/tmp/a\x00b"}}, "args.spec.source.path"),
    ],
)
def test_a_nul_in_a_spec_path_is_refused_naming_the_field(
    tmp_path: Path, change: dict[str, Any], field: str
) -> None:
    # realpath's ValueError reached the command's answer as an `internal` crash.
    source = {"type": "folder", "path": str(tmp_path)}
    spec = {"id": "cam", "model": {"name": "face-blazeface"}, "source": source}
    with pytest.raises(EdgeAgentError, match="NUL") as caught:
        checked_spec({**spec, **change}, tmp_path, [tmp_path / "agent.json"])
    assert (caught.value.code, caught.value.field) == ("command.invalid", field)
