"""Properties of IoU and NMS on arbitrary boxes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from edge_agent.heads.boxes import iou, nms, nms_per_class

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


def test_degenerate_box_overlaps_only_its_duplicate() -> None:
    point = np.array([1.0, 1.0, 1.0, 1.0])
    others = np.array([[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 2.0, 2.0], [1.0, 1.0, 1.0, 3.0]])
    np.testing.assert_array_equal(iou(point, others), [1.0, 0.0, 0.0])


TINY = np.float64(np.float32(1e-38))  # what Hypothesis found: a float32 subnormal-sized box


@pytest.mark.parametrize(
    "box",
    [
        [0.0, 0.0, 0.0, 0.0],  # a point
        [5.0, 5.0, 5.0, 9.0],  # a line
        [0.0, 0.0, TINY, TINY],  # tiny but real: its area underflows even in float64
        [1e-200, 1e-200, 3e-200, 3e-200],
        [9.0, 9.0, 4.0, 4.0],  # inverted
    ],
)
def test_identical_degenerate_boxes_suppress_each_other(box: list[float]) -> None:
    boxes = np.array([box, box, [100.0, 100.0, 110.0, 110.0]])
    assert iou(boxes[0], boxes[:2])[1] == 1.0
    np.testing.assert_array_equal(nms(boxes, np.array([0.8, 0.9, 0.7]), 0.5), [1, 2])


def test_tiny_boxes_have_the_iou_of_their_shape() -> None:
    # Half-overlapping boxes of any scale have IoU 1/3; products of 1e-200 underflow.
    for scale in (1.0, 1e-38, 1e-200, 1e200):
        a = np.array([0.0, 0.0, 2.0, 1.0]) * scale
        b = np.array([[1.0, 0.0, 3.0, 1.0]]) * scale
        np.testing.assert_allclose(iou(a, b), [1 / 3], rtol=1e-12)


def test_non_finite_boxes_give_no_nan() -> None:
    inf, nan = np.inf, np.nan
    weird = np.array(
        [[0, 0, inf, inf], [-inf, -inf, inf, inf], [nan, 0, 1, 1], [0, 0, 1, 1], [inf] * 4]
    )
    for box in weird:
        got = iou(box, weird)
        assert not np.isnan(got).any()
        assert np.all((got >= 0) & (got <= 1))
    keep = nms(weird, np.array([0.5, 0.4, 0.3, 0.2, 0.1]), 0.5)
    assert sorted(keep.tolist()) == sorted(set(keep.tolist()))


def test_nms_per_class_keeps_classes_apart() -> None:
    box = [10.0, 10.0, 20.0, 20.0]
    boxes = np.array([box, box, box, [10.0, 10.0, 10.0, 10.0], [10.0, 10.0, 10.0, 10.0]])
    scores = np.array([0.9, 0.8, 0.95, 0.7, 0.7])
    classes = np.array([0, 0, 1, 2, 2])
    # Class 1 beats class 0 on score, each keeps one box; the duplicate points suppress each
    # other and the tie keeps the first.
    np.testing.assert_array_equal(nms_per_class(boxes, scores, classes, 0.5), [2, 0, 3])
    assert nms_per_class(np.zeros((0, 4)), np.zeros(0), np.zeros(0, int), 0.5).size == 0


@given(
    st.lists(
        st.tuples(st.integers(0, 2), st.integers(0, 2), st.floats(0.0, 1.0), st.integers(0, 2)),
        min_size=1,
        max_size=20,
    ),
    st.sampled_from([0.0, 1e-300, 1e-38, 1e-3, 1.0, 1e30]),
)
def test_nms_per_class_equals_nms_on_each_class(
    items: list[tuple[int, int, float, int]], scale: float
) -> None:
    # Boxes on a coarse grid of tiny to huge sizes: duplicates and degenerate boxes abound.
    boxes = np.array([[x, y, x + w, y + w] for x, y, _, w in items], dtype=np.float64) * scale
    scores = np.array([s for _, _, s, _ in items])
    classes = np.array([x % 2 for x, _, _, _ in items])
    keep = nms_per_class(boxes, scores, classes, 0.5)
    for cls in (0, 1):
        members = np.flatnonzero(classes == cls)
        mine = keep[classes[keep] == cls]
        np.testing.assert_array_equal(mine, members[nms(boxes[members], scores[members], 0.5)])
    for i, k in enumerate(keep):
        same = keep[i + 1 :][classes[keep[i + 1 :]] == classes[k]]
        if same.size:
            assert np.all(iou(boxes[k], boxes[same]) <= 0.5)


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
