"""A pipeline whose file played to its end is remembered finished, and not played again.

It stayed recorded as one to run, so every restart or reboot of the agent played the file
again and sent all its results upstream once more: duplicates at the fleet, at every boot.
A run cut short (kill -9, a power cut, a stop of the agent) is still played again, as it
never sent all it had to. Real agent pipeline manager, real models, photos, video and
records; a restart is a new manager on the same state folder, as a new agent process is.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from edge_agent.agent.pipelines import Pipelines
from edge_agent.agent.records import AgentRecords
from edge_agent.clips import write_walk
from edge_agent.errors import EdgeAgentError
from edge_agent.pipelines.runner import PipelineHandle
from edge_agent.protocol.agent import AgentEvent, DetectionEvent, ResultMessage
from tests.agent_kit import agent_pipelines, photo_pipelines
from tests.disk_kit import files_capped_at


class _Heard:
    """What one agent's pipeline manager said: its events and results, and a flag for the
    end of a run (the `pipeline_stopped` its source's end says)."""

    def __init__(self) -> None:
        self.events: list[AgentEvent | DetectionEvent] = []
        self.results: list[ResultMessage] = []
        self.ended = threading.Event()

    def event(self, event: AgentEvent | DetectionEvent) -> None:
        self.events.append(event)
        if event.kind == "pipeline_stopped" and event.detail == "source ended":
            self.ended.set()

    def result(self, pipeline: str, result: ResultMessage) -> None:
        self.results.append(result)

    def kinds(self) -> list[str]:
        return [e.kind for e in self.events]


def _restarted(tmp_path: Path, cache_dir: Path, heard: _Heard) -> Pipelines:
    """The pipeline manager of the agent started again on the same state folder."""
    return agent_pipelines(tmp_path / "state", cache_dir, heard.event, heard.result)


@pytest.mark.parametrize("source", ["folder", "file"])
def test_a_file_that_played_out_is_listed_stopped_and_not_played_again_after_a_restart(
    tmp_path: Path, cache_dir: Path, astronaut: npt.NDArray[np.uint8], source: str
) -> None:
    before = _Heard()
    pipelines, spec = photo_pipelines(tmp_path, cache_dir, astronaut, before.event)
    spec["sinks"] = []
    if source == "file":
        video = write_walk(tmp_path / "walk.avi", frames=10).path
        spec["source"] = {"type": "file", "path": str(video)}
    try:
        pipelines.start(spec)
        assert before.ended.wait(30), "the file never played out"
    finally:
        pipelines.close()

    after = _Heard()
    again = _restarted(tmp_path, cache_dir, after)
    try:
        assert again.restore() == []
        [state] = again.states()
        assert (state.id, state.model, state.status) == ("cam", "face-blazeface", "stopped")
        assert state.detail.startswith("played its source to the end at 20"), state.detail
        assert after.kinds() == []  # nothing played, nothing said
        assert after.results == []
        # Listed, as it was before the restart: its id is taken until a stop forgets it.
        with pytest.raises(EdgeAgentError) as taken:
            again.start(spec)
        assert taken.value.code == "pipeline.exists"
        assert "played its source to the end" in str(taken.value)

        assert again.stop("cam").status == "stopped"
        assert again.states() == []
        assert again.records.record.pipelines == {}
        assert again.records.record.finished == {}

        # Started anew, it plays anew, and is remembered finished again.
        again.start(spec)
        assert after.ended.wait(30), "the new start never played out"
        assert after.results, "the new start sent no results"
        assert list(again.records.record.finished) == ["cam"]
    finally:
        again.close()


def test_a_file_cut_short_plays_again_after_a_restart(
    tmp_path: Path,
    cache_dir: Path,
    astronaut: npt.NDArray[np.uint8],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Held on its first result until the agent's stop (SIGTERM) has stopped it: the file
    # is cut short for certain. What a kill -9 or a power cut leaves on disk is the record
    # as the run had it; a stop of the agent leaves it as it was too.
    first_result, stopped = threading.Event(), threading.Event()

    def result(pipeline: str, message: ResultMessage) -> None:
        first_result.set()
        assert stopped.wait(30), "the test never stopped the agent"

    pipelines = agent_pipelines(tmp_path / "state", cache_dir, lambda event: None, result)
    video = write_walk(tmp_path / "walk.avi", frames=60).path
    spec = {
        "id": "cam",
        "model": {"name": "face-blazeface"},
        "source": {"type": "file", "path": str(video)},
        "sinks": [],
    }
    real_stop = PipelineHandle.stop

    def stop(handle: PipelineHandle) -> None:
        real_stop(handle)
        stopped.set()

    monkeypatch.setattr(PipelineHandle, "stop", stop)
    closer = threading.Thread(target=pipelines.close)
    try:
        pipelines.start(spec)
        assert first_result.wait(30)
        on_disk = AgentRecords(tmp_path / "state").record  # as a kill -9 leaves it
        assert list(on_disk.pipelines) == ["cam"]
        assert on_disk.finished == {}
        closer.start()  # the agent's stop, while the file plays
        closer.join(30)
        assert not closer.is_alive()
    finally:
        stopped.set()
        pipelines.close()
    monkeypatch.undo()

    after = _Heard()
    again = _restarted(tmp_path, cache_dir, after)
    try:
        assert again.restore() == ["cam"]
        assert after.ended.wait(30), "the restored file never played out"
        assert after.results
        assert list(again.records.record.finished) == ["cam"]
    finally:
        again.close()


def test_an_end_the_disk_refuses_to_record_is_said_and_the_pipeline_is_kept(
    tmp_path: Path,
    cache_dir: Path,
    astronaut: npt.NDArray[np.uint8],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A full or read-only state disk: the run's end is listed and said as any other; only
    # the mark is lost (logged with its fix), so a restart plays the file again.
    heard = _Heard()
    pipelines, spec = photo_pipelines(tmp_path, cache_dir, astronaut, heard.event)
    spec["sinks"] = []
    caplog.set_level(logging.ERROR, logger="edge_agent.agent")
    try:
        # Compiled once first: the model's cache is written then, not under the cap.
        pipelines.start({**spec, "id": "warm"}, persist=False)
        assert heard.ended.wait(30)
        pipelines.stop("warm")
        heard.ended.clear()
        pipelines.records.update(pipelines={"cam": spec})
        size = pipelines.records.path.stat().st_size
        with files_capped_at(size):  # the record cannot grow by the mark
            assert pipelines.restore() == ["cam"]
            assert heard.ended.wait(30)
        [state] = pipelines.states()
        assert (state.status, state.detail) == ("stopped", "source ended")
        assert pipelines.records.record.finished == {}
        assert AgentRecords(tmp_path / "state").record.pipelines == {"cam": spec}
        said = [
            vars(r)["fields"]
            for r in caplog.records
            if r.getMessage() == "pipeline_end_not_recorded"
        ]
        assert [s["pipeline"] for s in said] == ["cam"]
        assert "plays its file again" in said[0]["fix"]
    finally:
        pipelines.close()


def test_a_record_written_before_the_finished_mark_restores_its_pipelines(
    tmp_path: Path, cache_dir: Path, astronaut: npt.NDArray[np.uint8]
) -> None:
    # agent.json as the builds before this one wrote it: no `finished`. An upgrade must
    # bring every pipeline back, and keep what it did not change.
    _, spec = photo_pipelines(tmp_path, cache_dir, astronaut, lambda event: None)
    spec["sinks"] = []
    old: dict[str, Any] = {"seq": 1700000000, "telemetry_interval_s": 7.0, "pipelines": {}}
    old["pipelines"] = {"cam": spec, "door": {**spec, "id": "door"}}
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "agent.json").write_text(json.dumps(old))
    heard = _Heard()
    again = _restarted(tmp_path, cache_dir, heard)
    try:
        record = again.records.record
        assert (record.seq, record.telemetry_interval_s) == (1700000000, 7.0)
        assert record.pipelines == old["pipelines"]
        assert record.finished == {}
        assert sorted(again.restore()) == ["cam", "door"]
    finally:
        again.close()
