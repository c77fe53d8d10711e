"""Box geometry shared by the detection heads: IoU and greedy NMS, plain and per class.

Boxes are float arrays of x_min, y_min, x_max, y_max. Two identical boxes have IoU 1,
whatever their size, so duplicates suppress each other even when they have no area; a box
with no area overlaps nothing else. No input, however degenerate (zero, subnormal, inverted,
infinite or NaN coordinates), gives an IoU outside [0, 1].
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.floating]
IntArray = npt.NDArray[np.intp]


def iou(box: FloatArray, boxes: FloatArray) -> npt.NDArray[np.float64]:
    """Intersection over union of one box with each of `boxes`.

    Args:
        box: shape [4], x_min, y_min, x_max, y_max.
        boxes: shape [N, 4], same layout.

    Returns:
        Shape [N], each value in [0, 1]; 1 for a box identical to `box`.
    """
    b = np.asarray(box, dtype=np.float64).reshape(4)
    bs = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    out = np.zeros(len(bs), dtype=np.float64)
    # Infinite or NaN coordinates make inf - inf and 0 * inf; those pairs end up at 0 below.
    with np.errstate(all="ignore"):
        width = max(b[2] - b[0], 0.0)
        height = max(b[3] - b[1], 0.0)
        widths = np.clip(bs[:, 2] - bs[:, 0], 0.0, None)
        heights = np.clip(bs[:, 3] - bs[:, 1], 0.0, None)
        iw = np.clip(np.minimum(b[2], bs[:, 2]) - np.maximum(b[0], bs[:, 0]), 0.0, None)
        ih = np.clip(np.minimum(b[3], bs[:, 3]) - np.maximum(b[1], bs[:, 1]), 0.0, None)
        # IoU is unchanged when each axis is scaled on its own. Scaling each pair to its larger
        # width and height keeps areas of tiny boxes (1e-38 squared) from underflowing to 0.
        span_x = np.maximum(width, widths)
        span_y = np.maximum(height, heights)
        fx = np.divide(1.0, span_x, out=np.zeros_like(span_x), where=span_x > 0)
        fy = np.divide(1.0, span_y, out=np.zeros_like(span_y), where=span_y > 0)
        inter = (iw * fx) * (ih * fy)
        union = (width * fx) * (height * fy) + (widths * fx) * (heights * fy) - inter
        np.divide(inter, union, out=out, where=union > 0)
    # A box is its own perfect overlap even with no area, or NMS would keep every duplicate.
    out[np.all(bs == b, axis=1)] = 1.0
    # Rounding can push a perfect overlap a hair above 1.
    return np.clip(out, 0.0, 1.0)


def nms(boxes: FloatArray, scores: FloatArray, iou_threshold: float) -> IntArray:
    """Greedy non-maximum suppression.

    Args:
        boxes: shape [N, 4], x_min, y_min, x_max, y_max.
        scores: shape [N].
        iou_threshold: a box is dropped when its IoU with a kept, higher-scoring box
            exceeds this.

    Returns:
        Indices into `boxes` of the kept boxes, highest score first.
    """
    bs = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    # Stable sort keeps ties in input order, so results do not depend on the sort algorithm.
    order = np.argsort(-np.asarray(scores, dtype=np.float64).reshape(-1), kind="stable")
    keep: list[int] = []
    while order.size:
        best = int(order[0])
        keep.append(best)
        rest = order[1:]
        order = rest[iou(bs[best], bs[rest]) <= iou_threshold]
    return np.asarray(keep, dtype=np.intp)


def nms_per_class(
    boxes: FloatArray, scores: FloatArray, class_ids: npt.NDArray[np.integer], iou_threshold: float
) -> IntArray:
    """Class-aware NMS: boxes suppress only boxes of their own class.

    Each class runs on its own, on the boxes as given. (Shifting each class into a far-off
    region and running one NMS, the common trick, rounds tiny boxes to nothing and lets
    duplicates through.)

    Args:
        boxes: shape [N, 4], x_min, y_min, x_max, y_max.
        scores: shape [N].
        class_ids: shape [N], the class of each box.
        iou_threshold: as for `nms`.

    Returns:
        Indices into `boxes` of the kept boxes, highest score first, ties in input order.
    """
    bs = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    ss = np.asarray(scores, dtype=np.float64).reshape(-1)
    ids = np.asarray(class_ids).reshape(-1)
    kept: list[IntArray] = []
    for cls in np.unique(ids):
        members = np.flatnonzero(ids == cls)
        kept.append(members[nms(bs[members], ss[members], iou_threshold)])
    if not kept:
        return np.zeros(0, dtype=np.intp)
    found = np.concatenate(kept)
    # lexsort's last key is the primary one: score descending, then input order.
    return found[np.lexsort((found, -ss[found]))].astype(np.intp)
