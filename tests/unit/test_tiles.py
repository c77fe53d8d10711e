"""Tiles cover the frame, and their boxes merge into one box per object."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from edge_agent.heads.base import Detection
from edge_agent.heads.boxes import iou
from edge_agent.vision.geometry import Rect
from edge_agent.vision.tiles import cut_edges, merge_detections, tile_grid

FRAME = (1280, 720)


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
    for p in people:
        assert iou(np.array(p, dtype=np.float64), boxes).max() > 0.5
