"""BlazeFace decoding on synthetic regressor and logit tensors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from edge_agent.errors import EdgeAgentError
from edge_agent.heads.base import Detection
from edge_agent.heads.blazeface import (
    BlazeFaceConfig,
    BlazeFaceHead,
    decode_blazeface,
    ssd_anchors_128,
)

CONFIG = BlazeFaceConfig()
LOW = -20.0  # sigmoid(-20) is about 2e-9: far below any threshold
HIGH = 5.0  # sigmoid(5) is about 0.993


def blank() -> tuple[np.ndarray, np.ndarray]:
    return np.zeros((1, 896, 16), np.float32), np.full((1, 896, 1), LOW, np.float32)


def fine_index(gx: int, gy: int, k: int = 0) -> int:
    return (gy * 16 + gx) * 2 + k


def coarse_index(gx: int, gy: int, k: int = 0) -> int:
    return 512 + (gy * 8 + gx) * 6 + k


def test_anchor_layout() -> None:
    anchors = ssd_anchors_128()
    assert anchors.shape == (896, 2)
    assert anchors.dtype == np.float32
    np.testing.assert_allclose(anchors[fine_index(5, 7, 1)], [5.5 / 16, 7.5 / 16])
    np.testing.assert_allclose(anchors[coarse_index(3, 6, 5)], [3.5 / 8, 6.5 / 8])
    assert len(np.unique(anchors[:512], axis=0)) == 256
    assert len(np.unique(anchors[512:], axis=0)) == 64
    assert anchors.min() > 0
    assert anchors.max() < 1


def test_single_face_maps_to_frame_pixels() -> None:
    reg, logits = blank()
    i = fine_index(5, 7)
    reg[0, i, :4] = [4.0, -8.0, 32.0, 40.0]
    reg[0, i, 4:6] = [0.0, 0.0]
    reg[0, i, 6:8] = [12.8, 12.8]
    logits[0, i, 0] = HIGH
    [det] = decode_blazeface(reg, logits, (640, 480), CONFIG)
    # Anchor (5.5/16, 7.5/16) -> (220, 225) px; offsets scale by 640/128 and 480/128.
    np.testing.assert_allclose(det.box, (160.0, 120.0, 320.0, 270.0), atol=1e-6)
    assert det.keypoints[0] == pytest.approx((220.0, 225.0))
    assert det.keypoints[1] == pytest.approx((220.0 + 64.0, 225.0 + 48.0))
    assert len(det.keypoints) == 6
    assert det.score == pytest.approx(1 / (1 + np.exp(-HIGH)))
    assert (det.label, det.class_id) == ("face", 0)


def test_accepts_unbatched_tensors() -> None:
    reg, logits = blank()
    logits[0, coarse_index(2, 2), 0] = HIGH
    reg[0, coarse_index(2, 2), 2:4] = 20.0
    assert decode_blazeface(reg[0], logits[0], (128, 128), CONFIG) == decode_blazeface(
        reg, logits, (128, 128), CONFIG
    )


def test_scores_below_threshold_are_dropped() -> None:
    reg, logits = blank()
    reg[..., 2:4] = 20.0
    logits[0, 10, 0] = -0.1  # sigmoid just under 0.5
    assert decode_blazeface(reg, logits, (640, 480), CONFIG) == []


def test_saturated_logits_do_not_overflow() -> None:
    reg, logits = blank()
    reg[..., 2:4] = 20.0
    logits[...] = -1e30
    logits[0, 0, 0] = 1e30
    [det] = decode_blazeface(reg, logits, (128, 128), CONFIG)
    assert det.score == 1.0


def test_overlapping_faces_are_blended_by_score() -> None:
    reg, logits = blank()
    a, b = fine_index(8, 8, 0), fine_index(8, 8, 1)
    reg[0, a, :4] = [0.0, 0.0, 40.0, 40.0]
    reg[0, b, :4] = [4.0, 0.0, 40.0, 40.0]
    reg[0, a, 4:] = 0.0
    reg[0, b, 4:] = 8.0
    logits[0, a, 0], logits[0, b, 0] = 3.0, 1.0
    [det] = decode_blazeface(reg, logits, (128, 128), CONFIG)
    sa, sb = 1 / (1 + np.exp(-3.0)), 1 / (1 + np.exp(-1.0))
    centre = 8.5 / 16 * 128
    shift = 4.0 * sb / (sa + sb)
    expected = (centre - 20 + shift, centre - 20, centre + 20 + shift, centre + 20)
    np.testing.assert_allclose(det.box, expected, atol=1e-5)
    assert det.keypoints[2] == pytest.approx((centre + 8 * sb / (sa + sb),) * 2)
    assert det.score == pytest.approx(sa)


def test_separate_faces_stay_separate_best_first() -> None:
    reg, logits = blank()
    a, b = fine_index(2, 2), fine_index(12, 12)
    reg[0, [a, b], 2:4] = 16.0
    logits[0, a, 0], logits[0, b, 0] = 1.0, 2.0
    dets = decode_blazeface(reg, logits, (256, 256), CONFIG)
    assert [d.score for d in dets] == sorted((d.score for d in dets), reverse=True)
    assert len(dets) == 2
    assert dets[0].box[0] > dets[1].box[0]


def test_box_is_clipped_to_frame() -> None:
    reg, logits = blank()
    i = fine_index(0, 0)
    reg[0, i, 2:4] = 64.0
    logits[0, i, 0] = HIGH
    [det] = decode_blazeface(reg, logits, (300, 200), CONFIG)
    assert det.box[:2] == (0.0, 0.0)
    assert det.box[2] == pytest.approx((0.5 / 16 + 0.25) * 300)


@given(
    st.integers(0, 895),
    st.lists(st.floats(-200, 200, allow_nan=False), min_size=4, max_size=4),
    st.integers(1, 2000),
    st.integers(1, 2000),
)
def test_any_detection_lies_inside_the_frame(
    index: int, values: list[float], width: int, height: int
) -> None:
    reg, logits = blank()
    reg[0, index, :4] = values
    logits[0, index, 0] = HIGH
    for det in decode_blazeface(reg, logits, (width, height), CONFIG):
        x1, y1, x2, y2 = det.box
        assert 0 <= x1 < x2 <= width
        assert 0 <= y1 < y2 <= height


def test_wrong_anchor_count_is_rejected() -> None:
    with pytest.raises(ValueError, match="896 anchors"):
        decode_blazeface(np.zeros((1, 2304, 16)), np.zeros((1, 2304, 1)), (128, 128), CONFIG)


def test_head_reads_configured_outputs() -> None:
    reg, logits = blank()
    reg[0, 100, 2:4] = 30.0
    logits[0, 100, 0] = HIGH
    head = BlazeFaceHead(BlazeFaceConfig(regressors="r", scores="s", label="person-face"))
    [det] = head.decode({"r": reg, "s": logits}, (640, 480))
    assert isinstance(det, Detection)
    assert det.label == "person-face"
    with pytest.raises(
        EdgeAgentError,
        match=r"no output 'regressors' \(the manifest's \[head\] "
        r"regressors\); it has: r, s",
    ) as failed:
        BlazeFaceHead(CONFIG).decode({"r": reg, "s": logits}, (640, 480))
    assert failed.value.code == "model.incompatible"


def test_config_rejects_unknown_keys() -> None:
    with pytest.raises(ValueError, match="extra"):
        BlazeFaceConfig.model_validate({"type": "blazeface", "treshold": 0.5})
