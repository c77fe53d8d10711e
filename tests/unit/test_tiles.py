"""Tiles cover the frame, and their boxes merge into one box per object."""

from __future__ import annotations

import itertools
import time

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edge_agent.heads.base import Detection
from edge_agent.heads.boxes import iou, nms_per_class
from edge_agent.vision.geometry import Rect
from edge_agent.vision.tiles import cut_edges, merge_detections, merge_tiles, tile_grid

FRAME = (1280, 720)
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]


def seen_by(
    tiles: list[Rect], objects: list[Rect], visible: float = 0.25
) -> list[tuple[Rect, list[Detection]]]:
    """An ideal detector per tile: the visible part of each object, when enough of it shows."""
    out: list[tuple[Rect, list[Detection]]] = []
    for t in tiles:
        found: list[Detection] = []
        for k, o in enumerate(objects):
            x0, y0, x1, y1 = max(o[0], t[0]), max(o[1], t[1]), min(o[2], t[2]), min(o[3], t[3])
            if x1 <= x0 or y1 <= y0:
                continue
            if (x1 - x0) * (y1 - y0) < visible * (o[2] - o[0]) * (o[3] - o[1]):
                continue
            score = 0.6 + 0.3 * ((x1 - x0) * (y1 - y0)) / ((o[2] - o[0]) * (o[3] - o[1])) - 0.01 * k
            found.append(Detection(label="person", class_id=1, score=score, box=(x0, y0, x1, y1)))
        out.append((t, found))
    return out


@given(
    st.sampled_from([(1280, 720), (1920, 1080), (640, 480), (300, 900)]),
    st.sampled_from([300, 360, 540]),
    st.floats(0.0, 0.5),
)
def test_tiles_cover_the_frame_with_the_overlap(
    size: tuple[int, int], tile: int, overlap: float
) -> None:
    tiles = tile_grid(size, tile, overlap)
    covered = np.zeros((size[1], size[0]), dtype=np.int32)
    for x0, y0, x1, y1 in tiles:
        assert 0 <= x0 < x1 <= size[0]
        assert 0 <= y0 < y1 <= size[1]
        assert x1 - x0 == min(tile, size[0])
        assert y1 - y0 == min(tile, size[1])
        covered[y0:y1, x0:x1] += 1
    assert covered.min() >= 1
    xs = sorted({t[0] for t in tiles})
    # Neighbours share at least `overlap` of a side (up to a pixel of rounding).
    assert all(b - a <= tile * (1 - overlap) + 1 for a, b in itertools.pairwise(xs))


def test_720p_at_360_is_fifteen_tiles() -> None:
    tiles = tile_grid(FRAME, 360)
    assert len(tiles) == 15
    assert tiles[0] == (0, 0, 360, 360)
    assert tiles[-1] == (920, 360, 1280, 720)


def test_zones_limit_the_tiles() -> None:
    tiles = tile_grid(FRAME, 360, bounds=[(1000, 600, 1100, 700)])
    # A small zone near the corner becomes one tile shifted into the frame.
    assert tiles == [(870, 360, 1230, 720)]


def test_a_box_cut_by_a_tile_edge_comes_out_once() -> None:
    tiles = tile_grid(FRAME, 360)
    # Tiles start at x = 0, 230, 460, ...: this person straddles the edges at 360 and 590.
    person = (300, 200, 420, 480)
    per_tile = seen_by(tiles, [person], visible=0.1)
    assert sum(len(d) for _, d in per_tile) >= 3
    merged = merge_detections(per_tile, FRAME)
    assert len(merged) == 1
    assert iou(np.array(merged[0].box), np.array([person]))[0] > 0.95


def test_a_person_across_a_seam_is_one_whole_box_from_three_tiles() -> None:
    # Two pieces cut on facing edges of overlapping tiles overlap by more than NMS's IoU:
    # NMS dropped the bridging one, and the person came out as two boxes.
    tiles = tile_grid(FRAME, 360)
    person = (521, 102, 780, 442)
    per_tile = [(t, d) for t, d in seen_by(tiles, [person], visible=0.05) if d]
    assert len(per_tile) >= 3
    merged = merge_detections(per_tile, FRAME)
    assert [d.box for d in merged] == [(521.0, 102.0, 780.0, 442.0)]


def test_a_box_in_an_overlap_is_not_duplicated() -> None:
    tiles = tile_grid(FRAME, 360)
    person = (240, 20, 340, 200)  # inside tiles 0 and 1 whole
    per_tile = seen_by(tiles, [person])
    assert sum(len(d) for _, d in per_tile) == 2
    merged = merge_detections(per_tile, FRAME)
    assert [d.box for d in merged] == [(240.0, 20.0, 340.0, 200.0)]


def test_frame_border_is_not_a_cut() -> None:
    cuts = cut_edges(np.array([[0.0, 0.0, 100.0, 100.0]]), (0, 0, 360, 360), FRAME)
    assert not cuts.any()
    cuts = cut_edges(np.array([[300.0, 0.0, 360.0, 100.0]]), (0, 0, 360, 360), FRAME)
    assert cuts.tolist() == [[False, False, True, False]]


@st.composite
def crowds(draw: st.DrawFn) -> list[Rect]:
    """People 60-400 px tall, apart from each other by at least 30 px."""
    people: list[Rect] = []
    for _ in range(draw(st.integers(1, 6))):
        h = draw(st.integers(60, 400))
        w = max(20, int(h * draw(st.floats(0.3, 0.8))))
        x = draw(st.integers(0, FRAME[0] - w))
        y = draw(st.integers(0, FRAME[1] - h))
        box = (x, y, x + w, y + h)
        if all(
            box[2] + 30 < p[0] or p[2] + 30 < box[0] or box[3] + 30 < p[1] or p[3] + 30 < box[1]
            for p in people
        ):
            people.append(box)
    return people


@settings(max_examples=100, deadline=None)
@given(crowds(), st.sampled_from([300, 360]))
def test_each_person_comes_out_once(people: list[Rect], tile: int) -> None:
    merged = merge_detections(seen_by(tile_grid(FRAME, tile), people), FRAME)
    assert len(merged) == len(people)
    boxes = np.array([d.box for d in merged])
    # Whole, not cut short at a seam: NMS once kept the piece that ended on it, so a box
    # stopped at the tile's edge (and its feet, which zones go by, with it) at IoU 0.74.
    for p in people:
        assert iou(np.array(p, dtype=np.float64), boxes).max() > 0.9


# The merge as first written: after each join it rescanned every pair from the start, about
# n^3 steps. Kept as the reference the incremental merge must agree with, join for join.
def _reference_span_overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    inter = min(a1, b1) - max(a0, b0)
    union = max(a1, b1) - min(a0, b0)
    return inter / union if inter > 0 and union > 0 else 0.0


def _reference_joinable(
    a: FloatArray, cut_a: BoolArray, b: FloatArray, cut_b: BoolArray, within: float
) -> bool:
    if not (cut_a.any() or cut_b.any()):
        return False
    inter_w = min(a[2], b[2]) - max(a[0], b[0])
    inter_h = min(a[3], b[3]) - max(a[1], b[1])
    if inter_w <= 0 or inter_h <= 0:
        return False
    inter = inter_w * inter_h
    for box, cut in ((a, cut_a), (b, cut_b)):
        area = (box[2] - box[0]) * (box[3] - box[1])
        if cut.any() and area > 0 and inter / area >= within:
            return True
    across_x = (cut_a[2] and cut_b[0]) or (cut_a[0] and cut_b[2])
    across_y = (cut_a[3] and cut_b[1]) or (cut_a[1] and cut_b[3])
    if across_x and _reference_span_overlap(a[1], a[3], b[1], b[3]) >= 0.5:
        return True
    return bool(across_y and _reference_span_overlap(a[0], a[2], b[0], b[2]) >= 0.5)


_Item = tuple[FloatArray, float, int, BoolArray, list[int]]


def _reference_merge(
    b: FloatArray, s: FloatArray, c: IntArray, cut: BoolArray, within: float = 0.7
) -> tuple[list[list[float]], list[float], list[int], list[list[int]]]:
    # Whole boxes through NMS first; then each piece, highest score first, unless a kept
    # whole box of its class covers it (a piece never removes a piece).
    whole = [int(i) for i in np.flatnonzero(~cut.any(axis=1))]
    kept = [whole[k] for k in nms_per_class(b[whole], s[whole], c[whole], 0.5)]
    pieces = sorted(np.flatnonzero(cut.any(axis=1)).tolist(), key=lambda i: (-s[i], i))
    keep = kept + [
        i
        for i in pieces
        if not any(c[k] == c[i] and iou(b[k], b[i : i + 1])[0] > 0.5 for k in kept)
    ]
    items: list[_Item] = [
        (b[i].copy(), float(s[i]), int(c[i]), cut[i].copy(), [int(i)]) for i in keep
    ]
    joined = True
    while joined:
        joined = False
        for i in range(len(items)):
            for j in range(i + 1, len(items)):
                a, bb = items[i], items[j]
                if a[2] != bb[2] or not _reference_joinable(a[0], a[3], bb[0], bb[3], within):
                    continue
                union = np.concatenate(
                    [np.minimum(a[0][:2], bb[0][:2]), np.maximum(a[0][2:], bb[0][2:])]
                )
                edge = np.zeros(4, dtype=np.bool_)
                for box, cuts_of in ((a[0], a[3]), (bb[0], bb[3])):
                    edge |= cuts_of & np.isclose(box, union)
                items[i] = (union, max(a[1], bb[1]), a[2], edge, a[4] + bb[4])
                del items[j]
                joined = True
                break
            if joined:
                break
    items.sort(key=lambda item: -item[1])
    return (
        [it[0].tolist() for it in items],
        [it[1] for it in items],
        [it[2] for it in items],
        [sorted(it[4]) for it in items],
    )


def _busy_frame(
    rng: np.random.Generator, objects: int, frame: tuple[int, int] = (1920, 1080)
) -> tuple[FloatArray, FloatArray, IntArray, BoolArray]:
    """Objects of three classes, overlapping as in a crowd or a car park, seen by 360 px
    tiles: each tile reports the part it sees, with a detector's few pixels of error."""
    boxes: list[FloatArray] = []
    scores: list[float] = []
    classes: list[int] = []
    cuts: list[BoolArray] = []
    found: list[tuple[float, float, float, float, int]] = []
    for _ in range(objects):
        h = rng.uniform(40, 400)
        w = h * rng.uniform(0.3, 1.5)
        x, y = rng.uniform(0, frame[0] - w), rng.uniform(0, frame[1] - h)
        found.append((x, y, x + w, y + h, int(rng.integers(0, 3))))
    noise = float(rng.choice([0.0, 1.0, 3.0]))
    for t in tile_grid(frame, 360):
        for x0, y0, x1, y1, cls in found:
            part = np.array([max(x0, t[0]), max(y0, t[1]), min(x1, t[2]), min(y1, t[3])])
            if part[2] <= part[0] or part[3] <= part[1]:
                continue
            if (part[2] - part[0]) * (part[3] - part[1]) < 0.15 * (x1 - x0) * (y1 - y0):
                continue
            part = np.clip(part + rng.normal(0, noise, 4), t[:2] * 2, t[2:] * 2)
            if part[2] <= part[0] or part[3] <= part[1]:
                continue
            boxes.append(part)
            scores.append(float(rng.uniform(0.3, 0.95)))
            classes.append(cls)
            cuts.append(cut_edges(part[None], t, frame)[0])
    return np.array(boxes), np.array(scores), np.array(classes), np.array(cuts)


@pytest.mark.parametrize("seed", range(6))
def test_the_merge_joins_as_the_pair_by_pair_rescan_did(seed: int) -> None:
    rng = np.random.default_rng(seed)
    boxes, scores, classes, cuts = _busy_frame(rng, objects=int(rng.integers(20, 50)))
    merged = merge_tiles(boxes, scores, classes, cuts)
    assert len(boxes) >= 60
    assert (
        merged.boxes.tolist(),
        merged.scores.tolist(),
        merged.class_ids.tolist(),
        merged.sources,
    ) == _reference_merge(boxes, scores, classes, cuts)


def test_five_hundred_boxes_merge_in_well_under_half_a_second() -> None:
    boxes, scores, classes, cuts = _busy_frame(np.random.default_rng(1), objects=200)
    boxes, scores, classes, cuts = boxes[:500], scores[:500], classes[:500], cuts[:500]
    assert len(boxes) == 500
    started = time.perf_counter()
    merged = merge_tiles(boxes, scores, classes, cuts)
    took = time.perf_counter() - started
    assert len(merged.boxes) < 500
    # The pair-by-pair rescan took 2-4 s here.
    assert took < 0.5
