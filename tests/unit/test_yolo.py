"""YOLO decoding on synthetic v5, v8 and v11 outputs."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from edge_agent.errors import EdgeAgentError
from edge_agent.heads.base import Detection
from edge_agent.heads.boxes import iou
from edge_agent.heads.yolo import YoloConfig, YoloHead, decode_yolo

LABELS = ["person", "car", "dog"]
Pred = tuple[float, float, float, float, int, float]


def v8_output(preds: Sequence[Pred], anchors: int = 50, classes: int = 3) -> np.ndarray:
    """[1, 4 + C, N] with one prediction per anchor; the rest score nothing."""
    out = np.zeros((1, 4 + classes, anchors), np.float32)
    out[0, 2:4] = 10.0
    for i, (cx, cy, w, h, cls, score) in enumerate(preds):
        out[0, :4, i] = (cx, cy, w, h)
        out[0, 4 + cls, i] = score
    return out


def v5_output(preds: list[tuple[float, float, float, float, float, int, float]]) -> np.ndarray:
    out = np.zeros((1, 40, 5 + len(LABELS)), np.float32)
    for i, (cx, cy, w, h, obj, cls, score) in enumerate(preds):
        out[0, i, :5] = (cx, cy, w, h, obj)
        out[0, i, 5 + cls] = score
    return out


def config(**update: object) -> YoloConfig:
    return YoloConfig.model_validate({"labels": LABELS, **update})


@pytest.mark.parametrize("layout", ["v8", "v11"])
def test_box_is_scaled_to_the_stretched_frame(layout: str) -> None:
    raw = v8_output([(320, 320, 100, 200, 1, 0.9)])
    [det] = decode_yolo(raw, (1280, 720), config(layout=layout, input_size=(640, 640)))
    assert det.box == pytest.approx((540.0, 247.5, 740.0, 472.5))
    assert (det.label, det.class_id) == ("car", 1)
    assert det.score == pytest.approx(0.9)


def test_non_square_input_size() -> None:
    raw = v8_output([(160, 120, 32, 24, 0, 0.9)])
    [det] = decode_yolo(raw, (640, 480), config(input_size=(320, 240)))
    assert det.box == pytest.approx((288.0, 216.0, 352.0, 264.0))


@pytest.mark.parametrize("size", [(320, 320), (640, 480), (1280, 1280)])
def test_boxes_are_in_the_pixels_of_the_input_the_model_ran_on(size: tuple[int, int]) -> None:
    # Ultralytics measures boxes in the input's own pixels: a default input_size of 640x640
    # halved every box of a 320 px export, and the README's manifest never set it.
    raw = v8_output([(160, 120, 40, 80, 0, 0.9)])
    [det] = decode_yolo(raw, size, config())
    assert det.box == pytest.approx((140.0, 80.0, 180.0, 160.0))


def test_v5_multiplies_objectness_by_class_score() -> None:
    raw = v5_output([(100, 100, 50, 50, 0.8, 2, 0.5), (400, 400, 50, 50, 0.3, 0, 0.8)])
    [det] = decode_yolo(raw, (640, 640), config(layout="v5"))
    assert det.score == pytest.approx(0.4)
    assert det.label == "dog"
    assert det.box == pytest.approx((75.0, 75.0, 125.0, 125.0))


def test_best_class_wins_per_box() -> None:
    raw = v8_output([(100, 100, 50, 50, 0, 0.5)])
    raw[0, 4 + 2, 0] = 0.7
    [det] = decode_yolo(raw, (640, 640), config())
    assert det.class_id == 2


def test_nms_is_class_aware() -> None:
    same = [(100, 100, 50, 50, 0, 0.9), (102, 100, 50, 50, 0, 0.8)]
    dets = decode_yolo(v8_output(same), (640, 640), config())
    assert [d.score for d in dets] == [pytest.approx(0.9)]
    other = [(100, 100, 50, 50, 0, 0.9), (102, 100, 50, 50, 1, 0.8)]
    assert {d.label for d in decode_yolo(v8_output(other), (640, 640), config())} == {
        "person",
        "car",
    }


def test_max_detections_keeps_the_best() -> None:
    preds: list[Pred] = [(40.0 + 60 * i, 100, 40, 40, 0, 0.3 + 0.05 * i) for i in range(10)]
    dets = decode_yolo(v8_output(preds), (640, 640), config(max_detections=3))
    assert [d.score for d in dets] == pytest.approx([0.75, 0.7, 0.65])


def test_boxes_are_clipped_to_the_frame() -> None:
    [det] = decode_yolo(v8_output([(10, 630, 60, 60, 0, 0.9)]), (640, 640), config())
    assert det.box == pytest.approx((0.0, 600.0, 40.0, 640.0))


def test_wrong_class_count_is_reported() -> None:
    with pytest.raises(ValueError, match=r"3 classes should be \[1,7,N\]"):
        decode_yolo(np.zeros((1, 84, 8400), np.float32), (640, 640), config())
    with pytest.raises(ValueError, match=r"\[1,N,8\]"):
        decode_yolo(np.zeros((1, 8400, 85), np.float32), (640, 640), config(layout="v5"))


def test_nothing_above_threshold() -> None:
    assert decode_yolo(v8_output([(100, 100, 50, 50, 0, 0.2)]), (640, 640), config()) == []


def test_identical_tiny_boxes_suppress_each_other() -> None:
    # What Hypothesis found on a clean clone: two copies of a ~1e-38 box in class 1 both
    # survived, because shifting classes apart for one NMS pass rounded them to no area.
    tiny = float(np.float32(1e-38)) * 640
    raw = v8_output([(tiny, tiny, tiny, tiny, 1, 0.9), (tiny, tiny, tiny, tiny, 1, 0.9)])
    [det] = decode_yolo(raw, (640, 640), config(iou_threshold=0.5))
    assert det.class_id == 1
    assert det.box[0] < det.box[2]


@pytest.mark.parametrize("cls", [0, 2])
def test_duplicates_collapse_in_every_class(cls: int) -> None:
    raw = v8_output([(300, 300, 40, 40, cls, 0.6)] * 5 + [(300, 300, 40, 40, 1, 0.7)])
    dets = decode_yolo(raw, (640, 640), config())
    assert sorted(d.class_id for d in dets) == sorted([cls, 1])


def test_boxes_with_no_area_in_the_frame_are_dropped() -> None:
    # Zero width, and a box wholly outside the frame (clipped to a line on its edge).
    raw = v8_output([(100, 100, 0, 50, 0, 0.9), (700, 100, 20, 20, 0, 0.8)])
    assert decode_yolo(raw, (640, 640), config()) == []


@settings(deadline=None)
@given(
    arrays(np.float32, (1, 7, 60), elements=st.floats(0, 1, width=32)),
    st.tuples(st.integers(1, 1920), st.integers(1, 1080)),
)
def test_any_output_decodes_to_sane_detections(unit: np.ndarray, frame: tuple[int, int]) -> None:
    raw = unit.copy()
    raw[0, :4] *= 640  # centres and sizes anywhere in the input
    cfg = config(iou_threshold=0.5)
    dets = decode_yolo(raw, frame, cfg)
    assert [d.score for d in dets] == sorted((d.score for d in dets), reverse=True)
    for d in dets:
        x1, y1, x2, y2 = d.box
        assert 0 <= x1 < x2 <= frame[0]
        assert 0 <= y1 < y2 <= frame[1]
        assert d.score > cfg.score_threshold
    for i, a in enumerate(dets):
        for b in dets[i + 1 :]:
            if a.class_id == b.class_id:
                assert iou(np.array(a.box), np.array([b.box]))[0] <= 0.5 + 1e-9


def test_head_reads_configured_output() -> None:
    raw = v8_output([(320, 320, 100, 100, 2, 0.9)])
    [det] = YoloHead(config(output="out")).decode({"out": raw}, (640, 640))
    assert isinstance(det, Detection)
    assert det.label == "dog"
    with pytest.raises(EdgeAgentError, match=r"no output 'output0'.*; it has: out") as e:
        YoloHead(config()).decode({"out": raw}, (640, 640))
    assert e.value.code == "model.incompatible"


def test_config_needs_labels() -> None:
    with pytest.raises(ValueError, match="labels"):
        YoloConfig.model_validate({"type": "yolo"})
