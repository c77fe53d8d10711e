"""DBNet decoding on synthetic probability maps."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edge_agent.errors import EdgeAgentError
from edge_agent.heads.base import TextBox
from edge_agent.heads.dbnet import DbnetConfig, DbnetHead, decode_dbnet, mask_f1, text_mask

CONFIG = DbnetConfig()


def blank(height: int = 160, width: int = 320) -> np.ndarray:
    return np.zeros((1, 1, height, width), np.float32)


def expected_grown(x0: float, y0: float, x1: float, y1: float, ratio: float = 1.6) -> np.ndarray:
    """The rectangle grown by area * ratio / perimeter on every side."""
    w, h = x1 - x0, y1 - y0
    d = w * h * ratio / (2 * (w + h))
    return np.array([[x0 - d, y0 - d], [x1 + d, y0 - d], [x1 + d, y1 + d], [x0 - d, y1 + d]])


def signed_area(polygon: tuple[tuple[float, float], ...]) -> float:
    pts = np.asarray(polygon)
    x, y = pts[:, 0], pts[:, 1]
    return float(np.sum(x * np.roll(y, -1) - np.roll(x, -1) * y) / 2)


def test_axis_aligned_region_is_grown_and_ordered() -> None:
    prob = blank()
    prob[0, 0, 50:80, 100:200] = 0.9
    [box] = decode_dbnet(prob, (320, 160), CONFIG)
    np.testing.assert_allclose(box.polygon, expected_grown(100, 50, 200, 80), atol=2.0)
    assert box.score > CONFIG.box_threshold


def test_box_scales_from_map_to_frame() -> None:
    prob = blank()
    prob[0, 0, 50:80, 100:200] = 0.9
    [on_map] = decode_dbnet(prob, (320, 160), CONFIG)
    [on_frame] = decode_dbnet(prob, (1280, 320), CONFIG)
    np.testing.assert_allclose(
        np.asarray(on_frame.polygon), np.asarray(on_map.polygon) * [4, 2], atol=1e-6
    )


def test_score_is_mean_probability_inside() -> None:
    prob = blank()
    prob[0, 0, 20:60, 20:120] = 0.7
    [box] = decode_dbnet(prob[0, 0], (320, 160), CONFIG.model_copy(update={"dilate": False}))
    assert box.score == pytest.approx(0.7, abs=1e-6)


def test_dilation_joins_regions_split_by_one_pixel() -> None:
    prob = blank()
    prob[0, 0, 40:60, 40:100] = 0.9
    prob[0, 0, 40:60, 101:160] = 0.9
    assert len(decode_dbnet(prob, (320, 160), CONFIG)) == 1
    assert len(decode_dbnet(prob, (320, 160), CONFIG.model_copy(update={"dilate": False}))) == 2


def test_faint_region_fails_box_threshold() -> None:
    prob = blank()
    prob[0, 0, 50:80, 100:200] = 0.4  # above the pixel threshold, below the box threshold
    assert decode_dbnet(prob, (320, 160), CONFIG) == []
    assert len(decode_dbnet(prob, (320, 160), CONFIG.model_copy(update={"box_threshold": 0.3})))


def test_specks_are_dropped_by_min_size() -> None:
    prob = blank()
    prob[0, 0, 10:12, 10:12] = 1.0
    prob[0, 0, 100:102, 30:90] = 1.0  # long but too thin
    assert decode_dbnet(prob, (320, 160), CONFIG.model_copy(update={"dilate": False})) == []


def test_max_candidates_caps_the_count() -> None:
    prob = blank()
    for i in range(5):
        prob[0, 0, 10 + 30 * i : 30 + 30 * i, 20:200] = 0.9
    assert len(decode_dbnet(prob, (320, 160), CONFIG)) == 5
    assert len(decode_dbnet(prob, (320, 160), CONFIG.model_copy(update={"max_candidates": 2}))) == 2


def test_rotated_region_keeps_its_angle_and_order() -> None:
    prob = blank(200, 200)
    rect = ((100.0, 100.0), (120.0, 30.0), 30.0)
    cv2.fillPoly(prob[0, 0], [np.round(cv2.boxPoints(rect)).astype(np.int32)], 0.95)
    [box] = decode_dbnet(prob, (200, 200), CONFIG)
    pts = np.asarray(box.polygon)
    assert signed_area(box.polygon) > 0  # clockwise on screen, where y points down
    top_edge = pts[1] - pts[0]
    assert abs(np.degrees(np.arctan2(top_edge[1], top_edge[0])) - 30.0) < 3.0
    np.testing.assert_allclose(pts.mean(axis=0), (100.0, 100.0), atol=2.0)


def test_box_at_the_border_is_clipped() -> None:
    prob = blank()
    prob[0, 0, 0:30, 0:100] = 0.9
    [box] = decode_dbnet(prob, (640, 320), CONFIG)
    pts = np.asarray(box.polygon)
    assert pts.min() == 0.0
    assert pts[:, 0].max() <= 640
    assert pts[:, 1].max() <= 320


def test_rejects_maps_of_the_wrong_rank() -> None:
    with pytest.raises(ValueError, match="shape"):
        decode_dbnet(np.zeros((2, 1, 32, 32)), (32, 32), CONFIG)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(0, 140),
    st.integers(0, 300),
    st.integers(1, 60),
    st.integers(1, 200),
    st.floats(0.0, 1.0),
    st.tuples(st.integers(1, 2000), st.integers(1, 2000)),
)
def test_any_region_decodes_inside_the_frame(
    y: int, x: int, h: int, w: int, level: float, frame: tuple[int, int]
) -> None:
    prob = blank()
    prob[0, 0, y : y + h, x : x + w] = level
    for box in decode_dbnet(prob, frame, CONFIG):
        pts = np.asarray(box.polygon)
        assert pts.shape == (4, 2)
        assert np.all(pts >= 0)
        assert np.all(pts <= frame)
        assert CONFIG.box_threshold <= box.score <= 1.0
        assert signed_area(box.polygon) >= 0


def test_text_mask_fills_the_polygon() -> None:
    box = TextBox(score=0.9, polygon=((10.0, 20.0), (50.0, 20.0), (50.0, 40.0), (10.0, 40.0)))
    mask = text_mask([box], (64, 48))
    assert mask.shape == (48, 64)
    assert mask[30, 30]
    assert not mask[5, 5]
    assert not mask[30, 55]
    # fillPoly includes both edges, so 41 x 21 pixels.
    assert mask.sum() == 41 * 21
    assert not text_mask([], (64, 48)).any()


def test_mask_f1() -> None:
    a = np.zeros((10, 10), bool)
    b = np.zeros((10, 10), bool)
    assert mask_f1(a, b) == 1.0
    a[:, :4] = True
    assert mask_f1(a, b) == 0.0
    assert mask_f1(a, a) == 1.0
    b[:, 2:6] = True  # half of each mask overlaps the other
    assert mask_f1(a, b) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="shape"):
        mask_f1(a, np.zeros((5, 5), bool))


def test_decoded_boxes_cover_the_text() -> None:
    prob = blank()
    prob[0, 0, 50:80, 100:200] = 0.9
    truth = np.zeros((160, 320), bool)
    # The kernel grows by 100 * 30 * 1.6 / 260, about 18.5 px, on every side.
    truth[32:99, 82:219] = True
    got = text_mask(decode_dbnet(prob, (320, 160), CONFIG), (320, 160))
    assert mask_f1(got, truth) > 0.95


def test_head_reads_configured_output() -> None:
    prob = blank()
    prob[0, 0, 50:80, 100:200] = 0.9
    [box] = DbnetHead(DbnetConfig(output="map")).decode({"map": prob}, (320, 160))
    assert isinstance(box, TextBox)
    with pytest.raises(EdgeAgentError, match=r"no output 'sigmoid_0\.tmp_0'.*it has: map") as e:
        DbnetHead(CONFIG).decode({"map": prob}, (320, 160))
    assert e.value.code == "model.incompatible"
