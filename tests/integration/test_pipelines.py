"""Pipelines end to end: real video and speech, real models, events, hot swap."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import cv2
import numpy as np
import numpy.typing as npt
import pytest

from edge_agent.agent.sink import AgentSink
from edge_agent.catalog.catalog import Catalog
from edge_agent.clips import WalkVideo, write_walk
from edge_agent.heads.base import Detection, SpeechSegment
from edge_agent.infer import read_audio
from edge_agent.pipelines.audio_sources import WavSourceSpec
from edge_agent.pipelines.base import FrameResult
from edge_agent.pipelines.events import STREAM_ENDED, EventRule
from edge_agent.pipelines.runner import PipelineHandle
from edge_agent.pipelines.sinks import CallbackSink, JsonLinesSinkSpec
from edge_agent.pipelines.sources import FileSourceSpec, FolderSourceSpec
from edge_agent.pipelines.spec import ModelRef, PipelineSpec
from edge_agent.protocol.agent import AgentEvent, DetectionEvent, ResultMessage
from edge_agent.runtime.pool import ModelPool
from edge_agent.vision.zones import Zone
from tests.conftest import espeak, write_wav


@pytest.fixture(scope="module")
def walk(tmp_path_factory: pytest.TempPathFactory) -> WalkVideo:
    return write_walk(tmp_path_factory.mktemp("video") / "walk.avi")


@pytest.fixture(scope="module")
def long_walk(tmp_path_factory: pytest.TempPathFactory) -> WalkVideo:
    video = write_walk(tmp_path_factory.mktemp("video") / "long.avi", empty=70, crossing=80)
    assert video.frames == 300
    return video


@pytest.fixture
def pool(catalog: Catalog) -> ModelPool:
    return ModelPool(catalog)


PERSON_RULE = EventRule(name="person", label="person", appear_frames=2, gone_after_s=1.0)


def run_collect(spec: PipelineSpec, pool: ModelPool) -> tuple[list[FrameResult], PipelineHandle]:
    seen: list[FrameResult] = []
    handle = PipelineHandle(spec, pool, extra_sinks=[CallbackSink(seen.append)])
    try:
        handle.run()
    finally:
        handle.close()
    return seen, handle


def test_person_walks_in_and_out(walk: WalkVideo, pool: ModelPool) -> None:
    spec = PipelineSpec(
        id="walk",
        model=ModelRef(name="person-ssdlite"),
        source=FileSourceSpec(path=walk.path),
        events=[PERSON_RULE],
        sinks=[],
    )
    seen, handle = run_collect(spec, pool)
    frames = [r for r in seen if r.frame >= 0]
    # Files never drop a frame, and results come out in frame order.
    assert [r.frame for r in frames] == list(range(walk.frames))
    assert handle.telemetry.snapshot().dropped == 0
    found = [any(isinstance(d, Detection) for d in r.results) for r in frames]
    visible = [f for f, v in zip(found, walk.visible, strict=True) if v]
    absent = [f for f, a in zip(found, walk.absent, strict=True) if a]
    assert sum(visible) / len(visible) >= 0.95
    assert not any(absent)
    events = [(e.kind, r.frame) for r in seen for e in r.events]
    kinds = [k for k, _ in events]
    assert kinds.count("appeared") == 1
    assert kinds.count("gone") == 1
    appeared = next(f for k, f in events if k == "appeared")
    gone = next(f for k, f in events if k == "gone")
    first_visible = walk.visible.index(True)
    last_visible = len(walk.visible) - 1 - walk.visible[::-1].index(True)
    assert appeared <= first_visible + 2
    # "gone" fires 1 s (30 frames) after the last sighting, which is at most a few
    # frames past the last fully visible one.
    assert last_visible + 25 <= gone <= last_visible + 45


def test_stage_timings_are_recorded(walk: WalkVideo, pool: ModelPool) -> None:
    spec = PipelineSpec(
        id="timed",
        model=ModelRef(name="person-ssdlite"),
        source=FileSourceSpec(path=walk.path),
        max_frames=60,
        sinks=[],
    )
    seen, handle = run_collect(spec, pool)
    stats = handle.telemetry.snapshot()
    assert stats.frames == 60
    assert stats.fps > 0
    for stage in ("read", "preprocess", "queue", "infer", "postprocess", "sink", "end_to_end"):
        assert stats.stages[stage].count == 60, stage
    infer = stats.stages["infer"]
    assert 0 < infer.p50_ms <= infer.p95_ms <= infer.p99_ms <= infer.max_ms
    assert stats.stages["end_to_end"].p50_ms >= infer.p50_ms
    # Each result carries its own frame's stage times, as the telemetry measured them.
    frames = [r for r in seen if r.frame >= 0]
    assert len(frames) == 60
    for result in frames:
        assert set(result.timings) == {"read", "preprocess", "queue", "infer", "postprocess"}
        assert result.timings["infer"] > 0
        assert all(t >= 0 for t in result.timings.values())
    infer_ms = sorted(r.timings["infer"] * 1e3 for r in frames)
    assert infer_ms[-1] == pytest.approx(infer.max_ms)


def test_a_video_ending_with_the_person_in_view_closes_the_presence(
    walk: WalkVideo, pool: ModelPool
) -> None:
    # Stop while she stands in the middle: "appeared" gets its "gone", marked as the
    # end of the stream rather than a departure, on an events-only result at the end.
    last = max(i for i, v in enumerate(walk.visible) if v) - 5
    spec = PipelineSpec(
        id="cut",
        model=ModelRef(name="person-ssdlite"),
        source=FileSourceSpec(path=walk.path),
        events=[PERSON_RULE],
        max_frames=last + 1,
        sinks=[],
    )
    seen, _ = run_collect(spec, pool)
    events = [(r.frame, e) for r in seen for e in r.events]
    assert [e.kind for _, e in events] == ["appeared", "gone"]
    frame, gone = events[-1]
    assert frame == -1
    assert gone.detail == STREAM_ENDED
    assert gone.ts == pytest.approx(last / walk.fps)


def test_two_pipelines_share_one_compiled_model(walk: WalkVideo, pool: ModelPool) -> None:
    def spec(name: str) -> PipelineSpec:
        return PipelineSpec(
            id=name,
            model=ModelRef(name="person-ssdlite"),
            source=FileSourceSpec(path=walk.path),
            max_frames=80,
            sinks=[],
        )

    seen: dict[str, list[FrameResult]] = {"a": [], "b": []}
    handles = [
        PipelineHandle(spec(n), pool, extra_sinks=[CallbackSink(seen[n].append)]) for n in "ab"
    ]
    assert handles[0].model is handles[1].model
    assert len(pool) == 1
    threads = [threading.Thread(target=h.run) for h in handles]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    for h in handles:
        h.close()
    assert len(pool) == 0
    for name in "ab":
        assert [r.frame for r in seen[name]] == list(range(80))
        assert all(r.pipeline == name for r in seen[name])
    # Same frames, same model: the same answers, whichever pipeline asked.
    for ra, rb in zip(seen["a"], seen["b"], strict=True):
        assert [d.model_dump() for d in ra.results] == [d.model_dump() for d in rb.results]


def test_hot_swap_drops_no_frame(long_walk: WalkVideo, pool: ModelPool) -> None:
    spec = PipelineSpec(
        id="swap",
        model=ModelRef(name="person-ssdlite"),
        source=FileSourceSpec(path=long_walk.path),
        sinks=[],
    )
    seen: list[FrameResult] = []
    handle: PipelineHandle | None = None
    swapped: list[threading.Thread] = []

    def collect(result: FrameResult) -> None:
        seen.append(result)
        # Mid-crossing, so both models have someone to find.
        if result.frame == 130 and handle is not None:
            swapped.append(handle.swap_model(ModelRef(name="face-blazeface")))

    handle = PipelineHandle(spec, pool, extra_sinks=[CallbackSink(collect)])
    try:
        handle.run()
    finally:
        handle.close()
    frames = [r for r in seen if r.frame >= 0]
    assert [r.frame for r in frames] == list(range(300)), "every frame gets a result"
    models = [r.model for r in frames]
    switch = models.index("face-blazeface")
    assert 130 < switch < 190
    assert set(models[:switch]) == {"person-ssdlite"}
    assert set(models[switch:]) == {"face-blazeface"}
    # Said once, on the first frame the new model decoded (it rode on the next frame out,
    # still the old model's).
    swapped_on = [(r.frame, e.detail) for r in seen for e in r.events if e.kind == "model_swapped"]
    assert swapped_on == [(frames[switch].frame, "person-ssdlite -> face-blazeface")]
    # Each frame was decoded by its own model's head: faces only after the switch.
    before = [d for r in frames[:switch] for d in r.results]
    after = [d for r in frames[switch:] for d in r.results]
    assert before
    assert after
    assert all(isinstance(d, Detection) and d.label == "person" for d in before)
    assert all(isinstance(d, Detection) and d.label == "face" for d in after)
    assert len(pool) == 0, "both models released"


def test_speech_silence_speech(tmp_path: Path, pool: ModelPool) -> None:
    rate = 16000
    said = read_audio(espeak("turn on the lights in the loading dock", tmp_path / "a.wav"), rate)
    # Ground truth: where the voice is, not espeak's own quiet padding around it.
    loud = np.flatnonzero(np.abs(said) > 0.05 * np.abs(said).max())
    said = said[loud[0] : loud[-1] + 1]
    gap = np.zeros(2 * rate, dtype=np.float32)
    clip = np.concatenate([gap, said, gap, said, gap])
    path = tmp_path / "clip.wav"
    write_wav(path, clip, rate)
    truth = [(2.0, 2.0 + len(said) / rate)]
    truth.append((truth[0][1] + 2.0, truth[0][1] + 2.0 + len(said) / rate))
    spec = PipelineSpec(
        id="mic",
        model=ModelRef(name="vad-silero", hint="latency"),
        source=WavSourceSpec(path=path),
        events=[EventRule(name="talk", label="speech", gone_after_s=1.0)],
        sinks=[],
    )
    seen, _ = run_collect(spec, pool)
    segments = [s for r in seen for s in r.results if isinstance(s, SpeechSegment)]
    assert len(segments) == 2
    for seg, (start, end) in zip(segments, truth, strict=True):
        assert abs(seg.start - start) <= 0.1, (seg, start)
        assert abs(seg.end - end) <= 0.1, (seg, end)


def test_truncated_video_ends_with_error_event(walk: WalkVideo, tmp_path: Path) -> None:
    cut = tmp_path / "cut.avi"
    data = walk.path.read_bytes()
    cut.write_bytes(data[: len(data) // 2])
    proc = subprocess.run(
        [sys.executable, "-m", "edge_agent", "run-pipeline", "--model", "person-ssdlite",
         "--source", str(cut), "--json"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = [json.loads(ln) for ln in proc.stdout.splitlines()]
    errors = [e for ln in lines for e in ln.get("events", []) if e["kind"] == "source_error"]
    assert len(errors) == 1
    assert "summary" in lines[-1]
    assert 0 < lines[-1]["summary"]["frames"] < walk.frames
    stderr = [ln for ln in proc.stderr.splitlines() if ln.startswith("edge-agent: error:")]
    assert len(stderr) == 1


def test_cli_json_lines_and_summary(walk: WalkVideo) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "edge_agent", "run-pipeline", "--model", "person-ssdlite",
         "--source", str(walk.path), "--json", "--max-frames", "50"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(ln) for ln in proc.stdout.splitlines()]
    assert [ln["frame"] for ln in lines[:-1]] == list(range(50))
    assert all({"frame", "ts", "results", "events"} <= set(ln) for ln in lines[:-1])
    summary = lines[-1]["summary"]
    assert summary["frames"] == 50
    assert summary["dropped"] == 0
    assert summary["fps"] > 0
    assert {"p50_ms", "p95_ms", "p99_ms"} <= set(summary["stages"]["infer"])


def test_spec_file_runs(walk: WalkVideo, tmp_path: Path) -> None:
    spec = tmp_path / "dock.toml"
    spec.write_text(
        f"""
id = "dock"
max_frames = 30

[model]
name = "person-ssdlite"

[source]
type = "file"
path = "{walk.path}"

[[sinks]]
type = "jsonl"
path = "{tmp_path / "out.jsonl"}"
"""
    )
    proc = subprocess.run(
        [sys.executable, "-m", "edge_agent", "run-pipeline", str(spec), "--json"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    written = (tmp_path / "out.jsonl").read_text().splitlines()
    assert len(written) == 30
    assert json.loads(written[0])["pipeline"] == "dock"


def test_bad_spec_is_one_line(tmp_path: Path) -> None:
    spec = tmp_path / "bad.toml"
    spec.write_text('id = "x"\n[model]\nname = "person-ssdlite"\n[source]\ntype = "tape"\n')
    proc = subprocess.run(
        [sys.executable, "-m", "edge_agent", "run-pipeline", str(spec)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1
    assert "invalid at source" in proc.stderr


def test_zones_reach_results_json_lines_and_detection_events(
    astronaut: npt.NDArray[np.uint8], pool: ModelPool, tmp_path: Path
) -> None:
    # The astronaut stands to the photo's bottom edge: her box's bottom centre is in
    # "ground" (the lower half), not in "sky" (the top third), which her helmet reaches.
    photos = tmp_path / "photos"
    photos.mkdir()
    cv2.imwrite(str(photos / "0.jpg"), astronaut)
    height, width = astronaut.shape[:2]
    ground = Zone(
        name="ground",
        points=((0, height / 2), (width, height / 2), (width, height + 10), (0, height + 10)),
    )
    sky = Zone(name="sky", points=((0, 0), (width, 0), (width, height / 3), (0, height / 3)))
    lines = tmp_path / "results.jsonl"
    spec = PipelineSpec(
        id="photo",
        model=ModelRef(name="person-ssdlite"),
        source=FolderSourceSpec(path=photos),
        zones=[sky, ground],
        sinks=[JsonLinesSinkSpec(path=lines)],
    )
    messages: list[ResultMessage] = []
    events: list[AgentEvent | DetectionEvent] = []
    agent = AgentSink("photo", "all", lambda _, m: messages.append(m), events.append)
    seen: list[FrameResult] = []
    handle = PipelineHandle(spec, pool, extra_sinks=[CallbackSink(seen.append), agent])
    try:
        handle.run()
    finally:
        handle.close()
    [frame] = [r for r in seen if r.frame >= 0]
    people = [
        i for i, r in enumerate(frame.results) if isinstance(r, Detection) and r.label == "person"
    ]
    assert len(people) == 1, frame.results
    astronaut_box = frame.results[people[0]]
    assert isinstance(astronaut_box, Detection)
    assert astronaut_box.box[1] < height / 3, "her box reaches into the sky zone"
    assert frame.zones is not None
    assert frame.zones[people[0]] == ("ground",)
    [line] = [
        json.loads(ln) for ln in lines.read_text().splitlines() if json.loads(ln)["frame"] >= 0
    ]
    assert line["zones"][people[0]] == ["ground"]
    assert len(line["zones"]) == len(line["results"])
    [message] = messages
    assert message.zones is not None
    assert message.zones[people[0]] == ["ground"]
    new = [
        e
        for e in events
        if isinstance(e, DetectionEvent) and e.type == "new" and e.label == "person"
    ]
    assert [e.zones for e in new] == [["ground"]]
    end = [
        e
        for e in events
        if isinstance(e, DetectionEvent) and e.type == "end" and e.label == "person"
    ]
    assert [e.zones for e in end] == [["ground"]]
