"""A pipeline that finished is remembered so, not run again, and holds no slot meanwhile.

Finished: its file played to its end, or, whatever its source (a camera or a stream too),
it ran the max_frames it was given. It stayed recorded as one to run, so every restart or
reboot of the agent played the file again (a camera's max_frames too) and sent all its
results upstream once more: duplicates at the fleet, at every boot. A run cut short (kill
-9, a power cut, a stop of the agent, a camera lost) is still run again, as it never sent
all it had to. Listed stopped until a stop_pipeline, it computes nothing, and held a slot
of max_pipelines all the same: with the cap full of finished ones, every start was refused
command.busy. Real agent pipeline manager (and a real agent over mosquitto), real models,
photos, video, an MJPEG camera and records; a restart is a new manager on the same state
folder, as a new agent process is.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import numpy.typing as npt
import pytest

from edge_agent.agent.pipelines import Pipelines
from edge_agent.agent.records import AgentRecords
from edge_agent.clips import write_walk
from edge_agent.comms.local_broker import LocalBroker
from edge_agent.errors import EdgeAgentError
from edge_agent.pipelines.runner import PipelineHandle
from edge_agent.protocol.agent import AgentEvent, DetectionEvent, ResultMessage
from tests.agent_kit import InProcessAgent, Watcher, agent_pipelines, photo_pipelines, write_config
from tests.disk_kit import files_capped_at
from tests.integration.mjpeg_server import MjpegServer, free_port


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
        assert "runs again from its start" in said[0]["fix"]
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


def _stream(pipeline: str, url: str, max_frames: int) -> dict[str, Any]:
    """A face-blazeface pipeline on the MJPEG camera at `url`, giving up on it quickly."""
    return {
        "id": pipeline,
        "model": {"name": "face-blazeface"},
        "source": {
            "type": "stream",
            "url": url,
            "give_up_after_s": 0.5,
            "stall_timeout_s": 0.5,
            "reconnect_min_s": 0.05,
            "reconnect_max_s": 0.1,
        },
        "max_frames": max_frames,
        "sinks": [],
    }


def test_a_stream_that_ran_its_max_frames_is_not_run_again_after_a_restart_one_lost_is(
    tmp_path: Path, cache_dir: Path, astronaut: npt.NDArray[np.uint8]
) -> None:
    # A live source ends cleanly only once it has given the frames asked of it; one that
    # went away ends with an error, is retried, and must run again after a restart: its
    # frames were never all given.
    camera = MjpegServer(np.ascontiguousarray(astronaut[:, :, ::-1]), free_port(), fps=20)
    lost = f"http://127.0.0.1:{free_port()}/cam"  # nothing listens there
    before = _Heard()
    gate_failed = threading.Event()

    def on_event(event: AgentEvent | DetectionEvent) -> None:
        before.event(event)
        if event.kind == "pipeline_failed" and event.pipeline == "gate":
            gate_failed.set()

    camera.start()
    pipelines = agent_pipelines(tmp_path / "state", cache_dir, on_event, before.result)
    try:
        pipelines.start(_stream("gate", lost, 5))
        assert gate_failed.wait(30), "the lost camera's pipeline never failed"
        pipelines.start(_stream("door", camera.url, 5))
        assert before.ended.wait(30), "the stream never ran its max_frames"
        assert before.results, "the stream sent no results"
        states = {s.id: (s.status, s.detail) for s in pipelines.states()}
        assert states["door"] == ("stopped", "source ended")
        assert states["gate"][0] == "failed"
        assert list(pipelines.records.record.finished) == ["door"]
    finally:
        pipelines.close()
        camera.stop()

    after = _Heard()
    camera.start()
    again = _restarted(tmp_path, cache_dir, after)
    try:
        assert again.restore() == ["gate"]  # lost before its frames: runs again
        door = {s.id: s for s in again.states()}["door"]
        assert (door.model, door.status) == ("face-blazeface", "stopped")
        assert door.detail.startswith("ran the max_frames (5) it was given at 20"), door.detail
        assert [e for e in after.events if e.pipeline == "door"] == []
        assert [r for r in after.results if r.pipeline == "door"] == []
        with pytest.raises(EdgeAgentError) as taken:
            again.start(_stream("door", camera.url, 5))
        assert taken.value.code == "pipeline.exists"
        assert "ran the max_frames (5)" in str(taken.value)
    finally:
        again.close()
        camera.stop()


def test_a_mic_that_ran_its_max_frames_is_remembered_finished(
    tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The audio pipeline ends at its max_frames as the vision one does: finished too. A
    # fake `arecord` first on PATH (no sound card here) records silence for ever.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    arecord = bin_dir / "arecord"
    arecord.write_text("#!/bin/sh\nexec cat /dev/zero\n")
    arecord.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    spec = {
        "id": "hall",
        "model": {"name": "vad-silero"},
        "source": {"type": "mic"},
        "max_frames": 20,
        "sinks": [],
    }
    before = _Heard()
    pipelines = _restarted(tmp_path, cache_dir, before)
    try:
        pipelines.start(spec)
        assert before.ended.wait(30), "the mic never ran its max_frames"
        assert list(pipelines.records.record.finished) == ["hall"]
    finally:
        pipelines.close()

    after = _Heard()
    again = _restarted(tmp_path, cache_dir, after)
    try:
        assert again.restore() == []
        [state] = again.states()
        assert state.status == "stopped"
        assert state.detail.startswith("ran the max_frames (20) it was given at 20"), state.detail
        assert after.kinds() == []
    finally:
        again.close()


@pytest.mark.parametrize("source", ["folder", "stream"])
def test_a_finished_pipeline_holds_no_slot_of_max_pipelines(
    broker: LocalBroker,
    tmp_path: Path,
    astronaut: npt.NDArray[np.uint8],
    source: str,
) -> None:
    # The whole agent over mosquitto, its cap one pipeline: the finished one is listed
    # stopped, and the next start_pipeline is accepted, not refused command.busy.
    device = "finished-dev"
    camera = MjpegServer(np.ascontiguousarray(astronaut[:, :, ::-1]), free_port(), fps=20)
    photos = tmp_path / "photos"
    photos.mkdir()
    for i in range(3):
        cv2.imwrite(str(photos / f"{i}.jpg"), astronaut[:, :, ::-1])
    if source == "folder":
        first: dict[str, Any] = {
            "id": "cam",
            "model": {"name": "face-blazeface"},
            "source": {"type": "folder", "path": str(photos)},
            "sinks": [],
        }
    else:
        first = _stream("cam", camera.url, 5)
    config = write_config(
        tmp_path / "agent.toml",
        port=broker.port,
        device=device,
        state=tmp_path / "state",
        extra="max_pipelines = 1",
    )
    camera.start()
    watcher = Watcher(broker.port, device)
    agent = InProcessAgent(config)
    try:
        watcher.wait_state(lambda s: s["online"])
        watcher.ok("start_pipeline", {"spec": first}, timeout=60)
        watcher.wait_event(
            lambda e: e["kind"] == "pipeline_stopped" and e["pipeline"] == "cam",
            timeout=30,
            what="the first pipeline's end",
        )
        # A camera nothing listens for: it runs, waiting, and holds the one slot.
        waiting = _stream("door", f"http://127.0.0.1:{free_port()}/cam", 5)
        watcher.ok("start_pipeline", {"spec": waiting}, timeout=60)
        listed = {p["id"]: p["status"] for p in watcher.ok("list_pipelines")["pipelines"]}
        assert listed["cam"] == "stopped", listed
        assert set(listed) == {"cam", "door"}, listed
        # The cap still holds for those that run.
        third = {**waiting, "id": "gate"}
        answer = watcher.final(watcher.send("start_pipeline", {"spec": third}))
        assert answer["status"] == "error", answer
        assert answer["error"]["code"] == "command.busy", answer
    finally:
        agent.close()
        watcher.close()
        camera.stop()


def test_a_pipeline_held_over_the_cap_starts_when_another_finishes(
    tmp_path: Path, cache_dir: Path, astronaut: npt.NDArray[np.uint8]
) -> None:
    # A finished pipeline makes room as a stop_pipeline does: the one held over the cap at
    # the restore takes it, in the record's order, without waiting for a stop or a restart.
    pipelines, spec = photo_pipelines(tmp_path, cache_dir, astronaut, lambda event: None)
    spec["sinks"] = []
    video = write_walk(tmp_path / "walk.avi", frames=30).path
    looped = {"type": "file", "path": str(video), "loop": True, "realtime": True}
    endless = {**spec, "id": "door", "source": looped}
    pipelines.records.update(pipelines={"cam": spec, "door": endless})
    pipelines.max_running = 1
    try:
        assert pipelines.restore() == ["cam"]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            states = {s.id: s.status for s in pipelines.states()}
            if states == {"cam": "stopped", "door": "running"}:
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"the held pipeline never started: {pipelines.states()}")
    finally:
        pipelines.close()
