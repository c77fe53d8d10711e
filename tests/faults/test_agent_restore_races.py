"""Commands the broker held for the box, against the restore of the recorded pipelines.

At a start the agent restores the pipelines its record holds, working from the record as
it read it, while commands held for the box during its downtime come in. A held
stop_pipeline of a recorded pipeline not yet restored was answered "forgotten", and then
the restore started it anyway, unrecorded: running and listed, gone at the next restart.
A held start_pipeline of a recorded id made the restore report that running pipeline
failed (pipeline.exists). The race is made certain by holding the restore inside the
build of the pipeline before; the pool, models, photos and records are real.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from edge_agent.agent import pipelines as agent_pipelines
from edge_agent.pipelines.runner import PipelineHandle
from edge_agent.pipelines.spec import PipelineSpec
from edge_agent.protocol.agent import AgentEvent, DetectionEvent
from tests.agent_kit import photo_pipelines


def test_a_stop_that_comes_during_the_restore_keeps_the_pipeline_stopped(
    tmp_path: Path,
    cache_dir: Path,
    astronaut: npt.NDArray[np.uint8],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    events: list[AgentEvent | DetectionEvent] = []
    pipelines, spec = photo_pipelines(tmp_path, cache_dir, astronaut, events.append)
    pipelines.records.update(pipelines={p: {**spec, "id": p} for p in ("first", "cam")})
    building, release = threading.Event(), threading.Event()

    def held(spec: PipelineSpec, *args: Any, **kwargs: Any) -> PipelineHandle:
        if spec.id == "first":
            building.set()
            assert release.wait(30), "the test never let the restore go on"
        return PipelineHandle(spec, *args, **kwargs)

    monkeypatch.setattr(agent_pipelines, "PipelineHandle", held)
    restored: list[list[str]] = []
    restorer = threading.Thread(target=lambda: restored.append(pipelines.restore()))
    try:
        restorer.start()
        assert building.wait(30)
        answer = pipelines.stop("cam")  # the held command, while "first" builds
        assert answer.status == "stopped"
        release.set()
        restorer.join(60)
        assert not restorer.is_alive()

        assert restored == [["first"]]
        assert [s.id for s in pipelines.states()] == ["first"]
        assert list(pipelines.records.record.pipelines) == ["first"]
        assert not [e for e in events if e.kind == "pipeline_started" and e.pipeline == "cam"]
    finally:
        release.set()
        pipelines.close()


def test_a_stop_of_a_running_pipeline_during_the_restore_keeps_it_stopped(
    tmp_path: Path,
    cache_dir: Path,
    astronaut: npt.NDArray[np.uint8],
    camera: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A held start_pipeline of a recorded id, then a held stop_pipeline of it, while the
    # restore builds the pipeline before it. The stop forgot the record only after its
    # join (up to 5 s): a restore going on meanwhile found the id recorded and no longer
    # running, and started it again, unrecorded, behind a stop answered "stopped".
    events: list[AgentEvent | DetectionEvent] = []
    pipelines, spec = photo_pipelines(tmp_path, cache_dir, astronaut, events.append)
    live = {**spec, "id": "cam", "source": {"type": "stream", "url": camera}}
    pipelines.records.update(pipelines={"first": {**spec, "id": "first"}, "cam": live})
    building, release = threading.Event(), threading.Event()
    restorer_name = "restorer"

    def held(spec: PipelineSpec, *args: Any, **kwargs: Any) -> PipelineHandle:
        if spec.id == "first" and threading.current_thread().name == restorer_name:
            building.set()
            assert release.wait(30), "the test never let the restore go on"
        return PipelineHandle(spec, *args, **kwargs)

    restored: list[list[str]] = []
    restorer = threading.Thread(
        target=lambda: restored.append(pipelines.restore()), name=restorer_name
    )
    real_stop = PipelineHandle.stop

    def stop_while_the_restore_goes_on(handle: PipelineHandle) -> None:
        # Inside the stop, before its join: the restore runs to its end here.
        release.set()
        restorer.join(60)
        real_stop(handle)

    monkeypatch.setattr(agent_pipelines, "PipelineHandle", held)
    try:
        restorer.start()
        assert building.wait(30)
        pipelines.start(live)  # the held start_pipeline, while "first" builds
        monkeypatch.setattr(PipelineHandle, "stop", stop_while_the_restore_goes_on)
        assert pipelines.stop("cam").status == "stopped"  # the held stop_pipeline
        assert not restorer.is_alive()

        assert restored == [["first"]]
        assert [s.id for s in pipelines.states()] == ["first"]
        assert list(pipelines.records.record.pipelines) == ["first"]
    finally:
        release.set()
        pipelines.close()


def test_a_start_that_came_before_the_restore_is_not_reported_failed(
    tmp_path: Path, cache_dir: Path, astronaut: npt.NDArray[np.uint8]
) -> None:
    events: list[AgentEvent | DetectionEvent] = []
    pipelines, spec = photo_pipelines(tmp_path, cache_dir, astronaut, events.append)
    pipelines.records.update(pipelines={"cam": spec})
    try:
        pipelines.start(spec)  # the held start_pipeline, answered before the restore
        restored = pipelines.restore()
        assert [e for e in events if e.kind == "pipeline_failed"] == []
        assert restored == ["cam"]  # it runs, as the record says it should
        assert [s.id for s in pipelines.states()] == ["cam"]
        assert list(pipelines.records.record.pipelines) == ["cam"]
    finally:
        pipelines.close()


def test_a_restore_that_raises_a_bug_on_one_pipeline_restores_the_others(
    tmp_path: Path,
    cache_dir: Path,
    astronaut: npt.NDArray[np.uint8],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Only an EdgeAgentError was caught per pipeline: an engine's own error (OpenVINO's
    # RuntimeError on a full cache disk was one) ended the loop, and every pipeline
    # recorded after it stayed down with no word of it.
    events: list[AgentEvent | DetectionEvent] = []
    pipelines, spec = photo_pipelines(tmp_path, cache_dir, astronaut, events.append)
    pipelines.records.update(pipelines={p: {**spec, "id": p} for p in ("bad", "cam")})

    def engine_error(spec: PipelineSpec, *args: Any, **kwargs: Any) -> PipelineHandle:
        if spec.id == "bad":
            raise RuntimeError("basic_ios::clear: iostream error")
        return PipelineHandle(spec, *args, **kwargs)

    monkeypatch.setattr(agent_pipelines, "PipelineHandle", engine_error)
    try:
        assert pipelines.restore() == ["cam"]
        # The one that raised is listed failed, as it is still recorded.
        listed = [(s.id, s.status, s.detail.split(":")[0]) for s in pipelines.states()]
        assert listed[0][0] == "cam"
        assert listed[1:] == [("bad", "failed", "not started from its record (internal)")]
        failed = [e for e in events if e.kind == "pipeline_failed"]
        assert [(e.pipeline, e.code) for e in failed if isinstance(e, AgentEvent)] == [
            ("bad", "internal")
        ]
    finally:
        pipelines.close()
