"""Tiles: overlapping squares that cover a frame (or its zones), and the merge of their boxes.

A person 180 px tall in a 1280x720 frame squeezed into a 300x300 input is 40 px tall:
too small for a small detector. Cut into 360 px tiles, each run at the model's size, the
same person is 150 px tall. The cost is one model call per tile.

Merging (the idea of supervision's InferenceSlicer and SAHI, greedy and class-aware):
1. NMS over the union drops the copies of an object seen whole by two overlapping tiles.
2. A box that touches an interior edge of its tile (an edge that is not the frame's) saw
   only part of its object. It is joined with a box of the same class when
   - it lies mostly inside that box (another tile saw the object whole), or
   - the other box was cut on the facing edge of its own tile, the two overlap across
     the cut, and they agree along it (their spans along the edge overlap by half);
   the pair becomes their union, with the higher score, and the union is checked again.
   The pairs are found with numpy once; only a union's are found again.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from edge_agent.heads.base import Detection
from edge_agent.heads.boxes import iou, nms_per_class
from edge_agent.vision.geometry import Rect

FloatArray = npt.NDArray[np.float64]

EDGE_TOLERANCE = 0.02
"""A box edge within this fraction of the tile's side from the tile's edge touches it."""


def _starts(length: int, tile: int, stride: float) -> list[int]:
    if length <= tile:
        return [0]
    count = math.ceil((length - tile) / stride) + 1
    # Spread evenly so the last tile ends at the edge: overlaps are equal, never less.
    return [round(v) for v in np.linspace(0, length - tile, count)]


def tile_grid(
    frame_size: tuple[int, int],
    tile: int,
    overlap: float = 0.2,
    bounds: Sequence[Rect] = (),
) -> list[Rect]:
    """Square tiles of `tile` px overlapping by at least `overlap` of a side.

    Args:
        frame_size: (width, height) of the frame.
        tile: the side of a tile in frame pixels; a frame side shorter than it gives
            tiles as long as that side (letterboxed into the model later).
        overlap: fraction of a tile shared with its neighbour, 0 to under 1.
        bounds: rectangles to cover instead of the whole frame (the zones' bounding
            boxes); each is grown to at least a tile and kept inside the frame.

    Returns:
        Tiles as (x_min, y_min, x_max, y_max), row by row, without duplicates.
    """
    width, height = frame_size
    stride = max(1.0, tile * (1.0 - overlap))
    areas = list(bounds) or [(0, 0, width, height)]
    tiles: list[Rect] = []
    for x0, y0, x1, y1 in areas:
        # Grow a small area to a whole tile around its centre, then shift it into the frame.
        w, h = max(x1 - x0, min(tile, width)), max(y1 - y0, min(tile, height))
        left = min(max(0, (x0 + x1) // 2 - w // 2), max(0, width - w))
        top = min(max(0, (y0 + y1) // 2 - h // 2), max(0, height - h))
        side_w, side_h = min(tile, w), min(tile, h)
        for ty in _starts(h, side_h, stride):
            for tx in _starts(w, side_w, stride):
                rect = (left + tx, top + ty, left + tx + side_w, top + ty + side_h)
                if rect not in tiles:
                    tiles.append(rect)
    return tiles


def cut_edges(boxes: FloatArray, tile: Rect, frame_size: tuple[int, int]) -> npt.NDArray[np.bool_]:
    """Per box, [N, 4]: which of its left, top, right, bottom edges a tile edge cut.

    An edge counts when it lies on (within `EDGE_TOLERANCE` of) an edge of `tile`
    that is inside the frame; an edge on the frame's own border cut nothing.
    """
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    width, height = frame_size
    tol = EDGE_TOLERANCE * max(tile[2] - tile[0], tile[3] - tile[1])
    interior = np.array([tile[0] > 0, tile[1] > 0, tile[2] < width, tile[3] < height])
    near = np.stack(
        [
            b[:, 0] <= tile[0] + tol,
            b[:, 1] <= tile[1] + tol,
            b[:, 2] >= tile[2] - tol,
            b[:, 3] >= tile[3] - tol,
        ],
        axis=1,
    )
    return np.asarray(near & interior, dtype=np.bool_)


_PAIR_ROWS = 256
"""Boxes compared against all others at once: bounds the [rows, N] arrays of one step."""

Pair = tuple[int, int, int, int]
"""(first, second, first's version, second's version): a joinable pair while both
boxes are still at those versions (a join changes its box, so its pairs are found again)."""


def _span_overlap(
    a0: FloatArray, a1: FloatArray, b0: FloatArray, b1: FloatArray
) -> npt.NDArray[np.bool_]:
    """Per pair, whether the spans [a0, a1] and [b0, b1] overlap by half their union."""
    inter = np.minimum(a1, b1) - np.maximum(a0, b0)
    union = np.maximum(a1, b1) - np.minimum(a0, b0)
    ratio = np.divide(inter, union, out=np.zeros_like(inter), where=(inter > 0) & (union > 0))
    return np.asarray(ratio >= 0.5, dtype=np.bool_)


def _joinable(
    a: FloatArray,
    cut_a: npt.NDArray[np.bool_],
    b: FloatArray,
    cut_b: npt.NDArray[np.bool_],
    within: float,
) -> npt.NDArray[np.bool_]:
    """Per pair of rows of `a` and `b` ([N, 4] each, cut on edges `cut_a`, `cut_b`),
    whether they are parts of one object (the class is the caller's to compare).

    They are when one is cut, they intersect, and
    - a cut one lies `within` inside the other (by its own area), or
    - they were cut on facing edges (a's right and b's left, or a's bottom and b's top,
      either way round) and agree along the cut (spans overlap by half).
    The rule is symmetric in a and b.
    """
    inter_w = np.minimum(a[:, 2], b[:, 2]) - np.maximum(a[:, 0], b[:, 0])
    inter_h = np.minimum(a[:, 3], b[:, 3]) - np.maximum(a[:, 1], b[:, 1])
    inter = inter_w * inter_h
    inside = np.zeros(len(a), dtype=np.bool_)
    for box, cut in ((a, cut_a), (b, cut_b)):
        area = (box[:, 2] - box[:, 0]) * (box[:, 3] - box[:, 1])
        ratio = np.divide(inter, area, out=np.zeros_like(inter), where=area > 0)
        inside |= cut.any(axis=1) & (area > 0) & (ratio >= within)
    across_x = (cut_a[:, 2] & cut_b[:, 0]) | (cut_a[:, 0] & cut_b[:, 2])
    across_y = (cut_a[:, 3] & cut_b[:, 1]) | (cut_a[:, 1] & cut_b[:, 3])
    facing = across_x & _span_overlap(a[:, 1], a[:, 3], b[:, 1], b[:, 3])
    facing |= across_y & _span_overlap(a[:, 0], a[:, 2], b[:, 0], b[:, 2])
    one_cut = cut_a.any(axis=1) | cut_b.any(axis=1)
    return np.asarray(one_cut & (inter_w > 0) & (inter_h > 0) & (inside | facing))


def _pairs(
    boxes: FloatArray, cuts: npt.NDArray[np.bool_], class_ids: npt.NDArray[np.int64], within: float
) -> list[Pair]:
    """Every joinable pair (i < j) of same-class boxes, at version 0."""
    n = len(boxes)
    cut_any: npt.NDArray[np.bool_] = np.asarray(cuts.any(axis=1), dtype=np.bool_)
    found: list[Pair] = []
    # Candidates (same class, one cut, intersecting) are few among the N^2 pairs: found
    # with [rows, N] masks, and only those get the rule's finer tests.
    for lo in range(0, n, _PAIR_ROWS):
        index = np.arange(lo, min(n, lo + _PAIR_ROWS))
        rows = boxes[index, None, :]
        cross_x = np.minimum(rows[..., 2], boxes[None, :, 2]) > np.maximum(
            rows[..., 0], boxes[None, :, 0]
        )
        cross_y = np.minimum(rows[..., 3], boxes[None, :, 3]) > np.maximum(
            rows[..., 1], boxes[None, :, 1]
        )
        candidate = (
            (np.arange(n)[None, :] > index[:, None])
            & (class_ids[index, None] == class_ids[None, :])
            & (cut_any[index, None] | cut_any[None, :])
            & cross_x
            & cross_y
        )
        i, j = np.nonzero(candidate)
        i = index[i]
        ok = _joinable(boxes[i], cuts[i], boxes[j], cuts[j], within)
        found.extend((int(a), int(b), 0, 0) for a, b in zip(i[ok], j[ok], strict=True))
    return found


@dataclass(frozen=True, slots=True)
class Merged:
    """Boxes after the merge, in frame pixels."""

    boxes: FloatArray
    scores: FloatArray
    class_ids: npt.NDArray[np.int64]
    sources: list[list[int]]
    """Per merged box, the indices of the input boxes joined into it."""


def _first_pass(
    b: FloatArray,
    s: FloatArray,
    c: npt.NDArray[np.int64],
    cut: npt.NDArray[np.bool_],
    iou_threshold: float,
) -> npt.NDArray[np.intp]:
    """NMS in which only a whole view of an object removes a piece of it: the whole boxes
    first, highest score first, then every piece that no kept whole box covers.

    A piece never removes another piece: two pieces of one object cut on facing edges of
    overlapping tiles overlap by more than the threshold (a person across a seam of 360 px
    tiles at 20%), and NMS kept the half that ended on the seam, so the box stopped there
    (its feet, which zones go by, in the wrong place) or, with the bridging piece gone,
    the object was counted twice. The joins make one box of them instead.
    """
    pieces = cut.any(axis=1)
    whole = np.flatnonzero(~pieces)
    kept = whole[nms_per_class(b[whole], s[whole], c[whole], iou_threshold)]
    part = np.flatnonzero(pieces)
    part = part[np.lexsort((part, -s[part]))]
    covered = np.zeros(len(part), dtype=np.bool_)
    for k in kept.tolist():
        same = c[part] == c[k]
        if same.any():
            covered[same] |= iou(b[k], b[part[same]]) > iou_threshold
    return np.concatenate([kept, part[~covered]]).astype(np.intp)


def merge_tiles(
    boxes: npt.ArrayLike,
    scores: npt.ArrayLike,
    class_ids: npt.ArrayLike,
    cuts: npt.ArrayLike,
    iou_threshold: float = 0.5,
    within: float = 0.7,
) -> Merged:
    """Merge the boxes of all tiles of a frame (see the module's docstring).

    Args:
        boxes: [N, 4] in frame pixels, every tile's boxes together.
        scores: [N].
        class_ids: [N].
        cuts: [N, 4] bool, from `cut_edges` for each box's own tile.
        iou_threshold: NMS threshold over the union.
        within: a cut box this much inside another box (by its own area) is joined to it.

    Returns:
        The merged boxes, highest score first.
    """
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    c = np.asarray(class_ids, dtype=np.int64).reshape(-1)
    cut = np.asarray(cuts, dtype=np.bool_).reshape(-1, 4)
    keep = _first_pass(b, s, c, cut, iou_threshold)
    b, s, c, cut = b[keep].copy(), s[keep].copy(), c[keep], cut[keep].copy()
    sources = [[int(i)] for i in keep]
    alive = np.ones(len(b), dtype=np.bool_)
    version = [0] * len(b)
    # Greedy, in NMS order: the first joinable pair (by the earlier box, then the later)
    # joins, its union takes the earlier one's place and is checked again. That is
    # order-dependent on purpose: joins are not transitive (a piece joinable with parts of
    # two people may join one of them), and closing them over chained neighbours in a
    # crowd into one box. The pairs are found once and only the union's are found again;
    # rescanning every pair after each join took about n^3 steps, 18 s of CPU for the
    # 1,269 boxes of a busy 1080p frame, holding the GIL.
    pending = _pairs(b, cut, c, within)
    heapq.heapify(pending)
    while pending:
        i, j, vi, vj = heapq.heappop(pending)
        if not (alive[i] and alive[j] and version[i] == vi and version[j] == vj):
            continue  # a box of this pair was joined since it was found
        union = np.concatenate([np.minimum(b[i, :2], b[j, :2]), np.maximum(b[i, 2:], b[j, 2:])])
        # The union is cut only where a part of it still ends on a tile edge.
        cut[i] = (cut[i] & np.isclose(b[i], union)) | (cut[j] & np.isclose(b[j], union))
        b[i] = union
        s[i] = max(s[i], s[j])
        sources[i] += sources[j]
        alive[j] = False
        version[i] += 1
        others = np.flatnonzero(alive & (c == c[i]))
        others = others[others != i]
        near = _joinable(
            np.broadcast_to(b[i], (len(others), 4)),
            np.broadcast_to(cut[i], (len(others), 4)),
            b[others],
            cut[others],
            within,
        )
        for k in others[near].tolist():
            first, second = min(i, k), max(i, k)
            heapq.heappush(pending, (first, second, version[first], version[second]))
    order = sorted(np.flatnonzero(alive).tolist(), key=lambda k: -s[k])
    return Merged(
        boxes=b[order].reshape(-1, 4),
        scores=s[order],
        class_ids=c[order].astype(np.int64),
        sources=[sorted(sources[k]) for k in order],
    )


def merge_detections(
    per_tile: Sequence[tuple[Rect, Sequence[Detection]]],
    frame_size: tuple[int, int],
    iou_threshold: float = 0.5,
) -> list[Detection]:
    """`merge_tiles` for heads' detections already mapped to frame pixels, tile by tile.

    Args:
        per_tile: each tile (or region) with the detections found in it.
        frame_size: (width, height), so edges on the frame's border do not count as cuts.
        iou_threshold: NMS threshold over the union.

    Returns:
        One detection per object, highest score first; a joined one keeps the label and
        keypoints of its best-scoring part.
    """
    found = [(rect, d) for rect, dets in per_tile for d in dets]
    if not found:
        return []
    boxes = np.array([d.box for _, d in found], dtype=np.float64)
    cuts = np.concatenate(
        [cut_edges(boxes[i : i + 1], rect, frame_size) for i, (rect, _) in enumerate(found)]
    )
    merged = merge_tiles(
        boxes,
        [d.score for _, d in found],
        [d.class_id for _, d in found],
        cuts,
        iou_threshold,
    )
    out: list[Detection] = []
    for box, sources in zip(merged.boxes, merged.sources, strict=True):
        best = max((found[i][1] for i in sources), key=lambda d: d.score)
        x0, y0, x1, y1 = (float(v) for v in box)
        out.append(best.model_copy(update={"box": (x0, y0, x1, y1)}))
    return out
