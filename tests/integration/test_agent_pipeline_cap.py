"""The agent runs at most `max_pipelines` pipelines, and restores no more at a restart.

There was no limit: 100 start_pipeline commands naming a camera that refuses connections
were all answered ok, held 404 threads and 138 MB, were recorded, and came back at every
start. Past the cap a start is now refused command.busy, and a record holding more than
the cap restores the first ones only and lists the rest as failed, kept for a restart with
room (forgotten, as they once were, a cap lowered for a while lost them for good). A
deploy that restarts an audio pipeline keeps its slot for it. A real agent (on a thread)
over a real mosquitto, with face-blazeface and a stream nothing listens for; the restarts
on the agent's real pipeline manager, with vad-silero on a fake `arecord`.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from edge_agent.agent.pipelines import Pipelines
from edge_agent.agent.records import AgentRecords
from edge_agent.clips import write_walk
from edge_agent.comms.local_broker import LocalBroker, free_port
from edge_agent.errors import EdgeAgentError
from edge_agent.pipelines.runner import PipelineHandle
from tests.agent_kit import InProcessAgent, Watcher, photo_pipelines, write_config

DEVICE = "cap-dev"
CAP = 3


@pytest.fixture
def watcher(broker: LocalBroker) -> Iterator[Watcher]:
    running = Watcher(broker.port, DEVICE)
    yield running
    running.close()


def _config(broker: LocalBroker, tmp_path: Path) -> Path:
    return write_config(
        tmp_path / "agent.toml",
        port=broker.port,
        device=DEVICE,
        state=tmp_path / "state",
        extra=f"max_pipelines = {CAP}",
    )


def _spec(pipeline: str, port: int) -> dict[str, Any]:
    """A pipeline on a camera that refuses connections: it starts, and waits for it."""
    return {
        "id": pipeline,
        "model": {"name": "face-blazeface"},
        "source": {"type": "stream", "url": f"http://127.0.0.1:{port}/cam"},
    }


def _recorded(tmp_path: Path) -> list[str]:
    record = json.loads((tmp_path / "state" / "agent" / "agent.json").read_text())
    return list(record["pipelines"])


def _listed(watcher: Watcher) -> list[str]:
    return [p["id"] for p in watcher.ok("list_pipelines")["pipelines"]]


def test_a_start_past_the_cap_is_refused_busy_until_one_is_stopped(
    broker: LocalBroker, tmp_path: Path, watcher: Watcher
) -> None:
    port = free_port()
    agent = InProcessAgent(_config(broker, tmp_path))
    try:
        watcher.wait_state(lambda s: s["online"])
        for i in range(CAP):
            watcher.ok("start_pipeline", {"spec": _spec(f"cam{i}", port)}, timeout=60)

        answer = watcher.final(watcher.send("start_pipeline", {"spec": _spec("cam9", port)}))
        assert answer["status"] == "error", answer
        assert answer["error"]["code"] == "command.busy", answer
        assert "max_pipelines" in answer["error"]["message"], answer
        assert "stop one" in answer["error"]["message"], answer
        # Refused whole: not running, not listed, not recorded to come back at a restart.
        assert _listed(watcher) == ["cam0", "cam1", "cam2"]
        assert _recorded(tmp_path) == ["cam0", "cam1", "cam2"]

        # A stop makes room.
        watcher.ok("stop_pipeline", {"id": "cam1"})
        watcher.ok("start_pipeline", {"spec": _spec("cam9", port)}, timeout=60)
        assert sorted(_listed(watcher)) == ["cam0", "cam2", "cam9"]
    finally:
        agent.close()


def test_a_record_past_the_cap_restores_the_first_and_names_the_rest(
    broker: LocalBroker, tmp_path: Path, watcher: Watcher, caplog: pytest.LogCaptureFixture
) -> None:
    # What an agent of before the cap (or with a higher one) left in its record.
    port = free_port()
    ids = [f"cam{i}" for i in range(CAP + 2)]
    AgentRecords(tmp_path / "state" / "agent").update(
        pipelines={pipeline: _spec(pipeline, port) for pipeline in ids}
    )
    caplog.set_level(logging.INFO, logger="edge_agent.agent")
    agent = InProcessAgent(_config(broker, tmp_path))
    try:
        watcher.wait_state(lambda s: s["online"] and len(s["pipelines"]) >= CAP, timeout=60)
        listed = watcher.ok("list_pipelines")["pipelines"]
        assert [p["id"] for p in listed] == ids
        for held in listed[CAP:]:
            assert held["status"] == "failed"
            assert held["detail"].startswith(f"over max_pipelines ({CAP}): raise the cap")
        left_out = [
            vars(r)["fields"] for r in caplog.records if r.getMessage() == "pipelines_not_restored"
        ]
        assert [(f["pipelines"], f["max_pipelines"]) for f in left_out] == [
            (",".join(ids[CAP:]), CAP)
        ]
        last = ids[-1]
        watcher.wait_event(lambda e: e["pipeline"] == last, what="the last one's event")
        busy = [e for e in watcher.events() if e.get("code") == "command.busy"]
        assert [(e["kind"], e["pipeline"]) for e in busy] == [
            ("pipeline_failed", pipeline) for pipeline in ids[CAP:]
        ]
        # Kept, for a restart with room; holding their slots, no start takes their place.
        assert _recorded(tmp_path) == ids
        answer = watcher.final(watcher.send("start_pipeline", {"spec": _spec("new", port)}))
        assert answer["error"]["code"] == "command.busy", answer
        # Stopped, one is forgotten like any failed pipeline.
        watcher.ok("stop_pipeline", {"id": last})
        assert _recorded(tmp_path) == ids[:-1]
    finally:
        agent.close()


def test_restore_forgets_by_the_record_alone_not_for_a_command_that_came_first(
    tmp_path: Path, cache_dir: Path, astronaut: npt.NDArray[np.uint8]
) -> None:
    # Commands the broker held for the box may start a pipeline before the record is
    # restored. That one takes a slot, and the last recorded one does not fit this time;
    # forgetting it for that would let the order commands came in rewrite the record.
    pipelines, spec = photo_pipelines(tmp_path, cache_dir, astronaut, lambda event: None)
    # A file that never ends: `early`'s photos, played out, would be finished, and hold no
    # slot (the restore would rightly start every recorded one).
    video = write_walk(tmp_path / "walk.avi", frames=30).path
    spec["source"] = {"type": "file", "path": str(video), "realtime": True, "loop": True}
    pipelines.max_running = CAP
    recorded = [f"cam{i}" for i in range(CAP)]
    pipelines.records.update(pipelines={p: {**spec, "id": p} for p in recorded})
    try:
        pipelines.start({**spec, "id": "early"})
        # `early` is recorded too, after the others, and runs as the record says.
        assert pipelines.restore() == [*recorded[: CAP - 1], "early"]
        assert list(pipelines.records.record.pipelines) == [*recorded, "early"]
        [held] = [s for s in pipelines.states() if s.id == recorded[-1]]
        assert (held.status, held.detail.split(":")[0]) == ("failed", f"over max_pipelines ({CAP})")
    finally:
        pipelines.close()


def test_pipelines_over_the_cap_are_kept_and_start_once_it_has_room(
    tmp_path: Path, cache_dir: Path, astronaut: npt.NDArray[np.uint8]
) -> None:
    # After a downgrade to a build with a lower cap, or a cap lowered for a while: those
    # past it were forgotten at the first start, and no later cap brought them back.
    pipelines, spec = photo_pipelines(tmp_path, cache_dir, astronaut, lambda event: None)
    # A file that never ends: one that played out before the close would be remembered
    # finished, and rightly not started again by the restart with room.
    video = write_walk(tmp_path / "walk.avi", frames=30).path
    spec["source"] = {"type": "file", "path": str(video), "realtime": True, "loop": True}
    recorded = [f"cam{i}" for i in range(CAP + 2)]
    pipelines.records.update(pipelines={p: {**spec, "id": p} for p in recorded})
    pipelines.max_running = CAP
    try:
        assert pipelines.restore() == recorded[:CAP]
        failed = [s.id for s in pipelines.states() if s.status == "failed"]
        assert failed == recorded[CAP:]
    finally:
        pipelines.close()
    assert list(pipelines.records.record.pipelines) == recorded

    # The next start, with the cap raised: every one of them starts.
    raised = Pipelines(
        pipelines.pool,
        pipelines.layout,
        pipelines.records,
        "all",
        lambda pipeline, result: None,
        lambda event: None,
        max_running=CAP + 2,
    )
    try:
        assert raised.restore() == recorded
        assert not [s for s in raised.states() if "max_pipelines" in s.detail]
    finally:
        raised.close()


def test_a_stop_pipeline_makes_room_for_the_held_ones_in_record_order(
    tmp_path: Path, cache_dir: Path, astronaut: npt.NDArray[np.uint8]
) -> None:
    # The held one's detail tells the operator to stop others; the room they made was left
    # empty (or taken by the next start), and the held pipeline stayed down until a reboot.
    pipelines, spec = photo_pipelines(tmp_path, cache_dir, astronaut, lambda event: None)
    video = write_walk(tmp_path / "walk.avi", frames=30).path
    spec["source"] = {"type": "file", "path": str(video), "realtime": True, "loop": True}
    recorded = [f"cam{i}" for i in range(CAP + 2)]
    pipelines.records.update(pipelines={p: {**spec, "id": p} for p in recorded})
    pipelines.max_running = CAP

    def states() -> dict[str, str]:
        return {s.id: s.status for s in pipelines.states()}

    def wait_running(pipeline_id: str) -> None:
        deadline = time.monotonic() + 60
        while states().get(pipeline_id) != "running" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert states().get(pipeline_id) == "running", states()

    try:
        assert pipelines.restore() == recorded[:CAP]
        pipelines.stop("cam1")
        wait_running("cam3")  # the first held one, in the record's order
        assert states() == {"cam0": "running", "cam2": "running", "cam3": "running",
                            "cam4": "failed"}  # fmt: skip
        # The one still held keeps its slot against a new start.
        with pytest.raises(EdgeAgentError) as refused:
            pipelines.start({**spec, "id": "new"})
        assert refused.value.code == "command.busy"
        pipelines.stop("cam0")
        wait_running("cam4")
        assert set(states().values()) == {"running"}
        assert list(pipelines.records.record.pipelines) == ["cam2", "cam3", "cam4"]
    finally:
        pipelines.close()
    assert pipelines.handles() == {}  # none left running behind the close


@pytest.fixture
def quiet_mic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A vad-silero pipeline's spec (no id) on a microphone that is quiet for the test's
    length: a fake `arecord` first on PATH, as there is no sound card here."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    arecord = bin_dir / "arecord"
    arecord.write_text("#!/bin/sh\nexec sleep 60\n")
    arecord.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return {"model": {"name": "vad-silero"}, "source": {"type": "mic", "stall_timeout_s": 60}}


def test_a_deploy_restarts_an_audio_pipeline_in_its_own_slot_though_held_ones_fill_the_cap(
    tmp_path: Path, cache_dir: Path, astronaut: npt.NDArray[np.uint8], quiet_mic: dict[str, Any]
) -> None:
    # An audio pipeline cannot swap, so a deploy of its model stops it and starts it again.
    # The stop gave its slot up, the pipelines held over the cap filled the count, and the
    # start held the very pipeline it had stopped: a deploy ended it until the next restart.
    pipelines, _ = photo_pipelines(tmp_path, cache_dir, astronaut, lambda event: None)
    pipelines.max_running = 1
    pipelines.records.update(pipelines={p: {**quiet_mic, "id": p} for p in ("door", "gate")})
    try:
        assert pipelines.restore() == ["door"]
        assert pipelines.reload_model("vad-silero") == ["door"]
        states = {s.id: (s.status, s.detail.split(":")[0]) for s in pipelines.states()}
        assert states == {"door": ("running", ""), "gate": ("failed", "over max_pipelines (1)")}
        # The held one still holds its slot against a new start.
        with pytest.raises(EdgeAgentError) as refused:
            pipelines.start({**quiet_mic, "id": "new"})
        assert refused.value.code == "command.busy"
        assert list(pipelines.records.record.pipelines) == ["door", "gate"]
    finally:
        pipelines.close()


def test_a_start_during_a_deploys_restart_does_not_take_the_restarted_pipelines_slot(
    tmp_path: Path,
    cache_dir: Path,
    astronaut: npt.NDArray[np.uint8],
    quiet_mic: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The restart's stop takes the pipeline out of the running, then joins its thread: a
    # start_pipeline in that join found a free slot, and the restart then had none left.
    pipelines, _ = photo_pipelines(tmp_path, cache_dir, astronaut, lambda event: None)
    pipelines.max_running = 1
    pipelines.start({**quiet_mic, "id": "door"})
    real_stop = PipelineHandle.stop
    refused: list[EdgeAgentError] = []

    def start_during_the_stop(handle: PipelineHandle) -> None:
        try:
            pipelines.start({**quiet_mic, "id": "new"})
        except EdgeAgentError as exc:
            refused.append(exc)
        real_stop(handle)

    monkeypatch.setattr(PipelineHandle, "stop", start_during_the_stop)
    try:
        assert pipelines.reload_model("vad-silero") == ["door"]
        assert [e.code for e in refused] == ["command.busy"]
        assert [(s.id, s.status) for s in pipelines.states()] == [("door", "running")]
    finally:
        monkeypatch.undo()
        pipelines.close()
