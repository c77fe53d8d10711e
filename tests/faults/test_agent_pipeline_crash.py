"""A bug inside a running pipeline: the console hears of it and the agent goes on.

A pipeline that raises out of its run (not an operator-fixable error, which has its own
code) used to be marked failed in silence: no event went out, so a console that waits
for a pipeline's end waited for ever. The bug is injected by making the pipeline's run
raise; everything around it (the pool, the model, the photos, the records) is real.
"""

from __future__ import annotations

import errno
import threading
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from edge_agent.errors import EdgeAgentError
from edge_agent.pipelines.runner import PipelineHandle
from edge_agent.protocol.agent import AgentEvent, DetectionEvent
from tests.agent_kit import photo_pipelines


def test_a_pipeline_that_raises_is_reported_failed_and_the_next_one_runs(
    tmp_path: Path,
    cache_dir: Path,
    astronaut: npt.NDArray[np.uint8],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    events: list[AgentEvent | DetectionEvent] = []
    ended = threading.Event()

    def on_event(event: AgentEvent | DetectionEvent) -> None:
        events.append(event)
        if event.kind in ("pipeline_failed", "pipeline_stopped"):
            ended.set()

    pipelines, spec = photo_pipelines(tmp_path, cache_dir, astronaut, on_event)
    real_run = PipelineHandle.run

    def buggy(self: PipelineHandle) -> Any:
        raise ZeroDivisionError("a bug")

    try:
        monkeypatch.setattr(PipelineHandle, "run", buggy)
        pipelines.start(spec, persist=False)
        assert ended.wait(60), "no event said the pipeline ended"
        failed = [e for e in events if e.kind == "pipeline_failed"]
        assert len(failed) == 1, events
        assert isinstance(failed[0], AgentEvent)
        assert failed[0].pipeline == "cam"
        assert failed[0].code == "internal"
        assert "a bug" in failed[0].detail
        [state] = pipelines.states()
        assert state.status == "failed"
        assert "a bug" in state.detail

        # The agent goes on: the same id can be started again once stopped, and runs.
        monkeypatch.setattr(PipelineHandle, "run", real_run)
        pipelines.stop("cam")
        ended.clear()
        pipelines.start(spec, persist=False)
        assert ended.wait(60), "the second pipeline never ended"
        assert events[-1].kind == "pipeline_stopped", events
    finally:
        pipelines.close()


def test_a_start_the_state_disk_cannot_record_still_runs_and_can_be_stopped(
    tmp_path: Path,
    cache_dir: Path,
    astronaut: npt.NDArray[np.uint8],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The record is written after the launch; a full disk there used to unregister a
    # pipeline that was already running, out of reach of every command.
    events: list[AgentEvent | DetectionEvent] = []
    pipelines, spec = photo_pipelines(tmp_path, cache_dir, astronaut, events.append)

    def full(**changes: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    try:
        monkeypatch.setattr(pipelines.records, "update", full)
        state = pipelines.start(spec)
        assert state.status in ("running", "stopped")
        assert [s.id for s in pipelines.states()] == ["cam"]
        assert "cam" not in pipelines.records.record.pipelines
        monkeypatch.undo()
        pipelines.stop("cam")
        assert pipelines.states() == []
        assert not [t.name for t in threading.enumerate() if t.name.endswith("-cam")]
    finally:
        pipelines.close()


def test_a_stop_the_state_disk_cannot_record_is_said_and_can_be_sent_again(
    tmp_path: Path,
    cache_dir: Path,
    astronaut: npt.NDArray[np.uint8],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The record is written after the stop; a full disk there answered `internal` (an
    # OSError) with no pipeline_stopped event, for a pipeline that had stopped and that
    # the record brought back at the next restart without a word.
    events: list[AgentEvent | DetectionEvent] = []
    pipelines, spec = photo_pipelines(tmp_path, cache_dir, astronaut, events.append)

    def full(**changes: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    try:
        pipelines.start(spec)
        monkeypatch.setattr(pipelines.records, "update", full)
        with pytest.raises(EdgeAgentError) as refused:
            pipelines.stop("cam")
        assert refused.value.code == "path.unwritable"
        assert "stopped, but" in refused.value.problem
        assert "next restart" in refused.value.problem
        assert "stop_pipeline" in refused.value.fix
        # Its three photos may have played out first (a "source ended" event): this one is
        # the command's.
        assert len(_stopped(events, "stopped by command")) == 1
        assert pipelines.states() == []
        assert "cam" in pipelines.records.record.pipelines

        # Sent again with the disk still full: the same answer, and no event this time.
        with pytest.raises(EdgeAgentError) as again:
            pipelines.stop("cam")
        assert again.value.code == "path.unwritable"
        assert _stopped(events, "forgotten: not running") == []

        # With room again, it is forgotten.
        monkeypatch.undo()
        assert pipelines.stop("cam").status == "stopped"
        assert "cam" not in pipelines.records.record.pipelines
        assert len(_stopped(events, "forgotten: not running")) == 1
    finally:
        pipelines.close()


def _stopped(events: list[AgentEvent | DetectionEvent], detail: str) -> list[AgentEvent]:
    return [
        e
        for e in events
        if isinstance(e, AgentEvent) and e.kind == "pipeline_stopped" and e.detail == detail
    ]
