"""YOLO with letterbox: boxes come back to the frame as Ultralytics' own decoder puts them.

The reference below is written from Ultralytics' code, independently of edge-agent's
geometry: `LetterBox` (ultralytics/data/augment.py) pads the resized image with 114,
splitting the padding as round(d - 0.1) / round(d + 0.1); `scale_boxes`
(ultralytics/utils/ops.py) undoes it. Synthetic v8 outputs hold boxes placed with that
letterbox, so a stretch decode would miss them at every aspect but 1.
"""

from __future__ import annotations

import cv2
import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edge_agent.catalog.manifest import ImageInput, Manifest
from edge_agent.heads.base import Detection
from edge_agent.heads.boxes import iou
from edge_agent.heads.yolo import YoloConfig, YoloHead
from edge_agent.runtime.preprocess import input_geometry
from edge_agent.vision.mapping import to_frame

LABELS = ["person", "car", "dog"]
MODEL = 640
Boxes = npt.NDArray[np.float64]


def ultralytics_letterbox(
    image: npt.NDArray[np.uint8], new: int = MODEL
) -> tuple[npt.NDArray[np.uint8], float, tuple[int, int]]:
    """Ultralytics' LetterBox(auto=False, center=True): image, gain, (left, top)."""
    h, w = image.shape[:2]
    r = min(new / h, new / w)
    unpad_w, unpad_h = round(w * r), round(h * r)
    dw, dh = (new - unpad_w) / 2, (new - unpad_h) / 2
    resized = cv2.resize(image, (unpad_w, unpad_h), interpolation=cv2.INTER_LINEAR)
    top, bottom = round(dh - 0.1), round(dh + 0.1)
    left, right = round(dw - 0.1), round(dw + 0.1)
    padded = cv2.copyMakeBorder(
        resized, top, bottom, left, right, cv2.BORDER_CONSTANT, value=(114, 114, 114)
    )
    return np.asarray(padded, dtype=np.uint8), r, (left, top)


def ultralytics_scale_boxes(boxes: Boxes, frame: tuple[int, int], new: int = MODEL) -> Boxes:
    """Ultralytics' scale_boxes(img1_shape, boxes, img0_shape): model pixels to frame pixels."""
    w, h = frame
    gain = min(new / h, new / w)
    pad_x = round((new - w * gain) / 2 - 0.1)
    pad_y = round((new - h * gain) / 2 - 0.1)
    out = boxes.copy()
    out[:, [0, 2]] -= pad_x
    out[:, [1, 3]] -= pad_y
    out /= gain
    out[:, [0, 2]] = out[:, [0, 2]].clip(0, w)
    out[:, [1, 3]] = out[:, [1, 3]].clip(0, h)
    return out


def yolo_input() -> ImageInput:
    spec = Manifest.model_validate(
        {
            "name": "yolo-test",
            "description": "synthetic",
            "task": "detection",
            "licence": "MIT",
            "format": "onnx",
            "input": {
                "kind": "image",
                "name": "images",
                "shape": [1, 3, MODEL, MODEL],
                "layout": "NCHW",
                "element_type": "f32",
                "color": "RGB",
            },
            "head": {"type": "yolo", "labels": LABELS},
        }
    ).input
    assert isinstance(spec, ImageInput)
    return spec


def test_a_yolo_manifest_letterboxes_with_114_unless_told() -> None:
    spec = yolo_input()
    assert (spec.fit, spec.pad_value) == ("letterbox", 114)
    stretched = Manifest.model_validate(
        {
            "name": "yolo-test",
            "description": "synthetic",
            "task": "detection",
            "licence": "MIT",
            "format": "onnx",
            "input": {**spec.model_dump(), "fit": "stretch"},
            "head": {"type": "yolo", "labels": LABELS},
        }
    )
    assert isinstance(stretched.input, ImageInput)
    assert stretched.input.fit == "stretch"


@pytest.mark.parametrize("frame", [(320, 640), (480, 640), (640, 640), (1024, 640), (1280, 640)])
def test_the_letterboxed_input_is_ultralytics_own(frame: tuple[int, int]) -> None:
    rng = np.random.default_rng(frame[0])
    image = rng.integers(0, 256, (frame[1], frame[0], 3), dtype=np.uint8)
    theirs, _, _ = ultralytics_letterbox(image)
    ours = input_geometry(yolo_input(), frame).prepare(image)
    np.testing.assert_array_equal(ours, theirs)


@st.composite
def scenes(draw: st.DrawFn) -> tuple[tuple[int, int], list[tuple[Boxes, int]]]:
    """A frame of aspect 0.5 to 2 and a few objects of 32 px or more in it.

    Ultralytics' scale_boxes recomputes the padding from the unrounded gain, so it can sit
    a pixel off its own letterbox; smaller objects than YOLO finds anyway would make that
    pixel, not the fit, decide the IoU.
    """
    height = draw(st.integers(240, 1200))
    width = max(120, round(height * draw(st.floats(0.5, 2.0))))
    objects = []
    for _ in range(draw(st.integers(1, 4))):
        w = max(32.0, draw(st.floats(0.05, 0.4)) * width)
        h = max(32.0, draw(st.floats(0.05, 0.4)) * height)
        x0 = draw(st.floats(0, 1)) * (width - w)
        y0 = draw(st.floats(0, 1)) * (height - h)
        objects.append((np.array([x0, y0, x0 + w, y0 + h]), draw(st.integers(0, 2))))
    return (width, height), objects


@settings(max_examples=60, deadline=None)
@given(scenes())
def test_letterboxed_boxes_match_ultralytics_decode(
    scene: tuple[tuple[int, int], list[tuple[Boxes, int]]],
) -> None:
    frame, objects = scene
    gain = min(MODEL / frame[0], MODEL / frame[1])
    pad_x = round((MODEL - frame[0] * gain) / 2 - 0.1)
    pad_y = round((MODEL - frame[1] * gain) / 2 - 0.1)
    # The model "sees" each object where Ultralytics' letterbox put it.
    raw = np.zeros((1, 4 + len(LABELS), 64), np.float32)
    raw[0, 2:4] = 1.0
    for i, (box, label) in enumerate(objects):
        x0, y0, x1, y1 = box * gain + [pad_x, pad_y, pad_x, pad_y]
        raw[0, :4, i] = ((x0 + x1) / 2, (y0 + y1) / 2, x1 - x0, y1 - y0)
        raw[0, 4 + label, i] = 0.9 - 0.01 * i
    head = YoloHead(YoloConfig(labels=LABELS, iou_threshold=0.99))
    geometry = input_geometry(yolo_input(), frame)
    ours = to_frame(head.decode({"output0": raw}, geometry.model_size), geometry)
    # The reference decode: Ultralytics' own, from the same rows.
    rows = raw[0].T[: len(objects)].astype(np.float64)
    xyxy = np.stack(
        [
            rows[:, 0] - rows[:, 2] / 2,
            rows[:, 1] - rows[:, 3] / 2,
            rows[:, 0] + rows[:, 2] / 2,
            rows[:, 1] + rows[:, 3] / 2,
        ],
        axis=1,
    )
    reference = ultralytics_scale_boxes(xyxy, frame)
    assert len(ours) == len(objects)
    for box, (_, label) in zip(reference, objects, strict=True):
        same = [d for d in ours if isinstance(d, Detection) and d.label == LABELS[label]]
        best = max(iou(box, np.array([d.box for d in same]))) if same else 0.0
        assert best >= 0.9, (frame, box, [d.box for d in same])


def test_a_stretch_decode_would_miss_them() -> None:
    # Why the fit matters: at aspect 2 the stretched reading of a letterboxed box is far off.
    frame = (1280, 640)
    box = np.array([[400.0, 200.0, 480.0, 440.0]])
    gain = MODEL / 1280
    in_model = box * gain + [0, 160, 0, 160]
    stretched = in_model * [1280 / MODEL, 640 / MODEL, 1280 / MODEL, 640 / MODEL]
    assert iou(box[0], stretched)[0] < 0.6
    np.testing.assert_allclose(ultralytics_scale_boxes(in_model, frame), box)
