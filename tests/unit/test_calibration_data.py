"""What calibration holds of its data: frames at the model's input size, and a bounded
sample of long audio."""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path

import cv2
import numpy as np
import numpy.typing as npt
import pytest

from edge_agent.agent.records import AgentRecords, recorded_spec
from edge_agent.agent.specs import parse_spec
from edge_agent.audio.wav import read_wav
from edge_agent.catalog.manifest import ImageInput, load_manifest
from edge_agent.errors import EdgeAgentError
from edge_agent.paths import Layout
from edge_agent.pipelines.capture import CaptureSinkSpec
from edge_agent.pipelines.sources import FileSourceSpec
from edge_agent.pipelines.spec import DetectSpec, ModelRef, PipelineSpec, load_spec
from edge_agent.quantize import data
from edge_agent.quantize.data import AUDIO_STRETCH_S, load_clips, load_frames, resolve_data
from edge_agent.quantize.tasks import build_task
from edge_agent.runtime.preprocess import frame_tensor, input_geometry
from tests.conftest import REPO, bgr, sample, write_wav

FULL_HD = (1920, 1080)


def _spec(model: str) -> ImageInput:
    spec = load_manifest(REPO / "models" / f"{model}.toml").input
    assert isinstance(spec, ImageInput)
    return spec


def _full_hd_frame() -> npt.NDArray[np.uint8]:
    return np.asarray(cv2.resize(bgr(sample("astronaut")), FULL_HD), dtype=np.uint8)


def _no_runner(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    raise AssertionError("an image task never runs the model while splitting its samples")


def _bytes(sample: object) -> int:
    arrays = sample.values() if isinstance(sample, dict) else [sample]
    return sum(np.asarray(a).nbytes for a in arrays)


def test_calibration_frames_are_held_at_the_models_input_size(tmp_path: Path) -> None:
    # 300 1080p captures were held decoded (6.2 MB each) for the whole run, plus a float
    # tensor for each: 3.4 GB for text-det-ppocr, inside the agent beside its pipelines.
    frame = _full_hd_frame()
    for i in range(6):
        cv2.imwrite(str(tmp_path / f"slot-{i:05d}.jpg"), frame)
    video = cv2.VideoWriter(str(tmp_path / "cam.avi"), cv2.VideoWriter.fourcc(*"MJPG"), 5, FULL_HD)
    for _ in range(4):
        video.write(frame)
    video.release()
    spec = _spec("text-det-ppocr")
    frames = load_frames(tmp_path, 10, spec)
    model_bytes = spec.width * spec.height * 3
    assert len(frames) == 10
    assert sum(f.nbytes for f in frames) == 10 * model_bytes
    # Nothing of the decoded frame is kept alive behind a fitted one.
    assert all(f.base is None or f.base.nbytes == model_bytes for f in frames)
    # The split holds those frames, not a float tensor per frame; each is fed as the
    # tensor the whole frame makes.
    task = build_task(
        load_manifest(REPO / "models" / "text-det-ppocr.toml"), frames, [], 0.3, "auto",
        _no_runner, {},
    )  # fmt: skip
    held = task.calibration + task.holdout
    assert sum(_bytes(s) for s in held) == 10 * model_bytes
    decoded = cv2.imdecode(np.fromfile(tmp_path / "slot-00000.jpg", np.uint8), cv2.IMREAD_COLOR)
    fed = task.feed(task.holdout[0])[spec.name]
    np.testing.assert_array_equal(fed, frame_tensor(np.asarray(decoded, np.uint8), spec))


def test_long_audio_is_sampled_in_stretches_spread_across_every_recording(tmp_path: Path) -> None:
    # Every WAV was read whole and every 32 ms window of it calibrated: an hour was 112k
    # windows. Four 40 s recordings hold a ramp that says where each sample was recorded.
    rate, seconds = 16000, 40
    for i in range(4):
        timeline = (i * seconds + np.arange(seconds * rate) / rate) / 200
        write_wav(tmp_path / f"rec-{i}.wav", timeline.astype(np.float32), rate)
    clips = load_clips(tmp_path, rate, max_seconds=40.0)
    assert sum(len(c) for c in clips) == 40 * rate  # not the 160 s recorded
    assert [len(c) for c in clips] == [int(AUDIO_STRETCH_S * rate)] * 4
    # One stretch around the middle of each recording: 15-25 s, 55-65 s, ...; not 0-40 s.
    starts = [float(c[0]) * 200 for c in clips]
    np.testing.assert_allclose(starts, [15, 55, 95, 135], atol=0.05)
    # Within the budget, every recording is kept whole.
    assert [len(c) for c in load_clips(tmp_path, rate, max_seconds=160.0)] == [40 * rate] * 4


def test_each_recording_is_decoded_once_and_only_for_what_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Lengths came from decoding every recording whole, and over the budget each one
    # holding a stretch was decoded again: an hour of audio read twice for 40 s of it.
    rate, seconds = 16000, 40
    for i in range(4):
        write_wav(tmp_path / f"rec-{i}.wav", np.full(seconds * rate, i / 8, np.float32), rate)
    decoded: list[str] = []

    def counted(path: Path, to_rate: int | None = None) -> tuple[npt.NDArray[np.float32], int]:
        decoded.append(path.name)
        return read_wav(path, to_rate)

    monkeypatch.setattr(data, "read_wav", counted)
    [clip] = load_clips(tmp_path, rate, max_seconds=10.0)
    # One 10 s stretch, centred at 80 s of the 160: inside the third recording alone.
    assert decoded == ["rec-2.wav"]
    assert len(clip) == 10 * rate
    np.testing.assert_allclose(clip[[0, -1]], 2 / 8, atol=1e-3)
    decoded.clear()
    assert len(load_clips(tmp_path, rate, max_seconds=160.0)) == 4
    assert decoded == [f"rec-{i}.wav" for i in range(4)]


def test_a_damaged_recording_is_refused_even_where_no_stretch_falls(tmp_path: Path) -> None:
    # Read from its header alone, it is still checked as reading it would check it.
    rate = 16000
    write_wav(tmp_path / "rec-0.wav", np.zeros(40 * rate, np.float32), rate)
    (tmp_path / "rec-1.wav").write_bytes(b"RIFF\x00\x00\x00\x00WAVEjunk")
    with pytest.raises(EdgeAgentError, match=r"rec-1\.wav: WAV has no fmt chunk") as caught:
        load_clips(tmp_path, rate, max_seconds=10.0)
    assert caught.value.code == "input.unreadable"


def test_pipeline_data_is_read_where_its_capture_sink_writes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A capture sink with a folder of its own was never found: pipeline:<id> read the
    # pipeline's default captures folder and said it had captured nothing.
    layout = Layout(cache=tmp_path / "cache", state=tmp_path / "state")
    folder = layout.state / "dock-captures"
    folder.mkdir(parents=True)
    cv2.imwrite(str(folder / "slot-00000.jpg"), np.zeros((48, 64, 3), np.uint8))
    spec = PipelineSpec(
        id="dock",
        model=ModelRef(name="person-ssdlite"),
        source=FileSourceSpec(path=tmp_path / "walk.avi"),
        detect=DetectSpec(mode="tiles"),
        sinks=[CaptureSinkSpec(folder=folder)],
    )
    AgentRecords(layout.agent).update(pipelines={"dock": spec.model_dump(mode="json")})
    caplog.set_level(logging.WARNING, logger="edge_agent.quantize.data")
    # As the agent and the CLI read it: through the agent's record.
    assert resolve_data("pipeline:dock", layout, partial(recorded_spec, layout.agent)) == folder
    # It says plainly that the gate judges whole frames, not the tiles the pipeline serves.
    assert [r.getMessage() for r in caplog.records] == ["calibration_whole_frames"]


def test_a_capture_sink_on_an_audio_pipeline_is_refused(tmp_path: Path) -> None:
    # It was accepted and wrote nothing: the audio pipeline has no frames to keep.
    path = tmp_path / "ears.toml"
    path.write_text(
        'id = "ears"\nmodel = {name = "vad-silero"}\nsource = {type = "mic"}\n'
        'sinks = [{type = "capture"}]\n'
    )
    with pytest.raises(EdgeAgentError, match="capture sink keeps video frames") as caught:
        load_spec(path)
    assert "\n" not in str(caught.value)


def test_a_recorded_audio_pipelines_capture_sink_is_dropped_not_the_pipeline() -> None:
    # An earlier build recorded it: refused at restore, the mic never came back after the
    # upgrade, for a sink that never wrote anything.
    spec = {
        "id": "ears",
        "model": {"name": "vad-silero"},
        "source": {"type": "mic"},
        "sinks": [{"type": "capture"}, {"type": "jsonl", "path": "ears.jsonl"}],
    }
    restored = parse_spec(spec, recorded=True)
    assert [s.type for s in restored.sinks] == ["jsonl"]
    with pytest.raises(EdgeAgentError, match="capture sink keeps video frames"):
        parse_spec(spec)


def test_a_photo_at_the_models_size_is_centre_cropped_as_serving_crops_it(tmp_path: Path) -> None:
    # Calibration read it as an already fitted input and skipped text-orientation's crop:
    # the model was calibrated and gated on frames it never serves.
    spec = _spec("text-orientation")
    assert spec.center_crop < 1
    photo = np.random.default_rng(0).integers(0, 256, (spec.height, spec.width, 3), np.uint8)
    cv2.imwrite(str(tmp_path / "page.png"), photo)
    [frame] = load_frames(tmp_path / "page.png", 1, spec)
    served = input_geometry(spec, (spec.width, spec.height)).prepare(photo)
    np.testing.assert_array_equal(frame, served)
    assert not np.array_equal(frame, photo)


def test_video_frames_are_spread_over_the_whole_file(tmp_path: Path) -> None:
    # A step of total // limit rounded down to 1 under twice the limit: a 20 s clip gave
    # only its first half, and a person walking in later was never calibrated on or judged.
    photo = np.asarray(cv2.resize(bgr(sample("astronaut")), (320, 240)), dtype=np.uint8)
    video = cv2.VideoWriter(
        str(tmp_path / "cam.avi"), cv2.VideoWriter.fourcc(*"MJPG"), 5, (320, 240)
    )
    for i in range(30):  # each frame says its index in its brightness
        video.write(np.clip(photo.astype(np.int16) // 4 + i * 6, 0, 255).astype(np.uint8))
    video.release()
    spec = _spec("person-ssdlite")
    frames = load_frames(tmp_path / "cam.avi", 16, spec)
    assert len(frames) == 16
    levels = [float(f.mean()) for f in frames]
    assert levels == sorted(levels)
    # The first and the last frame of the file are both among them, and none twice.
    first, last = np.clip(
        photo.astype(np.int16) // 4 + np.array([0, 29 * 6])[:, None, None, None], 0, 255
    )
    spread = (levels[-1] - levels[0]) / (float(last.mean()) - float(first.mean()))
    assert spread > 0.95, levels
    assert len(set(np.round(levels, 1))) == 16
