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
