"""Real inference on the reference models, real inputs, decoded answers checked."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from edge_agent.heads.base import Classification, Detection, SpeechSegment, TextBox
from edge_agent.infer import infer_frame, infer_speech, read_audio
from tests.conftest import CompileFn, bgr, espeak, sample, write_wav


def _detections(results: Sequence[object]) -> list[Detection]:
    return [r for r in results if isinstance(r, Detection)]


@pytest.mark.parametrize("backend", ["openvino"])
def test_person_found_on_astronaut(
    compiled: CompileFn, astronaut: npt.NDArray[np.uint8], backend: str
) -> None:
    model, resolved = compiled("person-ssdlite", backend)
    people = _detections(infer_frame(model, resolved.manifest, astronaut))
    assert len(people) == 1
    person = people[0]
    assert person.label == "person"
    assert person.score > 0.85
    x0, y0, x1, y1 = person.box
    # The astronaut fills the left two thirds of the 512x512 photo, head near the top.
    assert x0 < 60
    assert y0 < 80
    assert 300 < x1 < 450
    assert y1 > 450


def test_no_person_on_coffee(compiled: CompileFn, coffee: npt.NDArray[np.uint8]) -> None:
    model, resolved = compiled("person-ssdlite")
    assert _detections(infer_frame(model, resolved.manifest, coffee)) == []


def test_face_found_on_astronaut(compiled: CompileFn, astronaut: npt.NDArray[np.uint8]) -> None:
    model, resolved = compiled("face-blazeface")
    faces = _detections(infer_frame(model, resolved.manifest, astronaut))
    assert len(faces) == 1
    face = faces[0]
    assert face.score > 0.8
    x0, y0, x1, y1 = face.box
    # Eileen Collins' face sits around (225, 125) in the photo.
    assert x0 < 225 < x1
    assert y0 < 125 < y1
    assert 50 < x1 - x0 < 160
    assert len(face.keypoints) == 6


def test_no_face_on_coffee(compiled: CompileFn, coffee: npt.NDArray[np.uint8]) -> None:
    model, resolved = compiled("face-blazeface")
    assert _detections(infer_frame(model, resolved.manifest, coffee)) == []


# np.rot90 turns counter-clockwise; the model names the clockwise angle of the page.
@pytest.mark.parametrize(("turns", "label"), [(0, "0"), (1, "270"), (2, "180"), (3, "90")])
@pytest.mark.parametrize("backend", ["openvino", "onnxruntime"])
def test_page_orientation(compiled: CompileFn, turns: int, label: str, backend: str) -> None:
    model, resolved = compiled("text-orientation", backend)
    page = np.ascontiguousarray(np.rot90(sample("page"), turns))
    frame = np.repeat(page[:, :, None], 3, axis=2)
    results = infer_frame(model, resolved.manifest, frame)
    best = results[0]
    assert isinstance(best, Classification)
    assert best.label == label
    assert best.score > 0.6
    assert len(results) == 4  # top_k = 4 in the manifest, best first
    scores = [r.score for r in results if isinstance(r, Classification)]
    assert scores == sorted(scores, reverse=True)


@pytest.mark.parametrize("backend", ["openvino", "onnxruntime"])
def test_text_found_on_page(compiled: CompileFn, backend: str) -> None:
    model, resolved = compiled("text-det-ppocr", backend)
    page = sample("page")
    frame = np.repeat(page[:, :, None], 3, axis=2)
    boxes = [r for r in infer_frame(model, resolved.manifest, frame) if isinstance(r, TextBox)]
    assert len(boxes) >= 5
    height, width = page.shape
    for box in boxes:
        xs = [p[0] for p in box.polygon]
        ys = [p[1] for p in box.polygon]
        assert 0 <= min(xs) <= max(xs) <= width
        assert 0 <= min(ys) <= max(ys) <= height
        # Text lines are wide and flat.
        assert max(xs) - min(xs) > max(ys) - min(ys)


def test_no_text_on_blank(compiled: CompileFn) -> None:
    model, resolved = compiled("text-det-ppocr")
    blank = np.full((480, 640, 3), 200, dtype=np.uint8)
    assert infer_frame(model, resolved.manifest, blank) == []


@pytest.fixture(scope="module")
def speech_clip(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[tuple[float, float]]]:
    """Silence, speech, silence, speech, silence; returns the file and where speech is."""
    folder = tmp_path_factory.mktemp("speech")
    spoken = read_audio(
        espeak("the quick brown fox jumps over the lazy dog", folder / "a.wav"), 16000
    )
    # espeak pads its own output with quiet; the truth is where the voice is loud.
    loud = np.flatnonzero(np.abs(spoken) > 0.02)
    spoken = spoken[loud[0] : loud[-1] + 1]
    gap = np.zeros(int(1.5 * 16000), dtype=np.float32)
    parts = [gap, spoken, gap, spoken, gap]
    truth, t = [], 0.0
    for i, part in enumerate(parts):
        if i % 2:
            truth.append((t, t + len(part) / 16000))
        t += len(part) / 16000
    path = folder / "clip.wav"
    write_wav(path, np.concatenate(parts), 16000)
    return path, truth


@pytest.mark.parametrize("backend", ["openvino", "onnxruntime"])
def test_vad_finds_speech_not_silence(
    compiled: CompileFn, speech_clip: tuple[Path, list[tuple[float, float]]], backend: str
) -> None:
    model, resolved = compiled("vad-silero", backend)
    path, truth = speech_clip
    segments = infer_speech(model, resolved.manifest, read_audio(path, 16000))
    assert all(isinstance(s, SpeechSegment) for s in segments)
    assert len(segments) == len(truth)
    for seg, (start, end) in zip(segments, truth, strict=True):
        assert abs(seg.start - start) < 0.25
        assert abs(seg.end - end) < 0.35
        # Nothing is called speech in the silences.
    assert segments[0].start > 1.0


def test_backends_agree_on_text_map(compiled: CompileFn) -> None:
    """OpenVINO's folded preprocessing and ONNX Runtime's numpy one feed the same tensor."""
    ov_model, resolved = compiled("text-det-ppocr", "openvino", precision="f32")
    ort_model, _ = compiled("text-det-ppocr", "onnxruntime")
    frame = bgr(sample("astronaut"))
    name = resolved.manifest.input.name
    a = np.asarray(ov_model.infer({name: frame[None]})["sigmoid_0.tmp_0"], dtype=np.float32)
    b = np.asarray(ort_model.infer({name: frame[None]})["sigmoid_0.tmp_0"], dtype=np.float32)
    assert a.shape == b.shape == (1, 1, 640, 640)
    assert float(np.abs(a - b).mean()) < 0.01
