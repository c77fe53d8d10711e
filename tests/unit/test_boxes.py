"""Properties of IoU and NMS on arbitrary boxes."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from edge_agent.heads.boxes import iou, nms

coord = st.floats(min_value=-1000.0, max_value=1000.0, allow_nan=False)
size = st.floats(min_value=0.5, max_value=500.0, allow_nan=False)


@st.composite
def boxes_st(draw: st.DrawFn) -> tuple[float, float, float, float]:
    x, y, w, h = draw(coord), draw(coord), draw(size), draw(size)
    return (x, y, x + w, y + h)


@given(boxes_st(), boxes_st())
def test_iou_is_symmetric_and_bounded(a: tuple[float, ...], b: tuple[float, ...]) -> None:
    ab = iou(np.array(a), np.array([b]))[0]
    ba = iou(np.array(b), np.array([a]))[0]
    assert 0.0 <= ab <= 1.0
    assert np.isclose(ab, ba, atol=1e-12)


@given(boxes_st())
def test_iou_with_itself_is_one(a: tuple[float, ...]) -> None:
    assert np.isclose(iou(np.array(a), np.array([a]))[0], 1.0)


def test_iou_of_known_overlap() -> None:
    # Two unit-height boxes overlapping by half their width: inter 1, union 3.
    got = iou(np.array([0.0, 0.0, 2.0, 1.0]), np.array([[1.0, 0.0, 3.0, 1.0], [5, 5, 6, 6]]))
    np.testing.assert_allclose(got, [1 / 3, 0.0])


def test_degenerate_box_overlaps_nothing() -> None:
    assert iou(np.array([1.0, 1.0, 1.0, 1.0]), np.array([[1.0, 1.0, 1.0, 1.0]]))[0] == 0.0


@given(
    st.lists(st.tuples(boxes_st(), st.floats(0.0, 1.0)), min_size=1, max_size=30),
    st.floats(0.05, 0.95),
)
def test_nms_keeps_best_and_leaves_no_overlaps(
    items: list[tuple[tuple[float, ...], float]], threshold: float
) -> None:
    boxes = np.array([b for b, _ in items])
    scores = np.array([s for _, s in items])
    keep = nms(boxes, scores, threshold)
    assert scores[keep[0]] == scores.max()
    assert len(set(keep.tolist())) == len(keep)
    assert np.all(np.diff(scores[keep]) <= 0)
    for i, k in enumerate(keep):
        others = keep[i + 1 :]
        if others.size:
            assert np.all(iou(boxes[k], boxes[others]) <= threshold)
    # Every dropped box was suppressed by a kept box that scores at least as high.
    for d in set(range(len(boxes))) - set(keep.tolist()):
        overlaps = iou(boxes[d], boxes[keep]) > threshold
        assert np.any(overlaps & (scores[keep] >= scores[d]))


def test_nms_on_nothing_returns_nothing() -> None:
    assert nms(np.zeros((0, 4)), np.zeros(0), 0.5).size == 0
