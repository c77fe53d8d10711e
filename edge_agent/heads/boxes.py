"""Box geometry shared by the detection heads: IoU and greedy NMS.

Boxes are float arrays of x_min, y_min, x_max, y_max; a box with no area has IoU 0
with everything, itself included, so degenerate boxes never suppress anything.
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
        Shape [N], each value in [0, 1].
    """
    b = np.asarray(box, dtype=np.float64).reshape(4)
    bs = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    iw = np.clip(np.minimum(b[2], bs[:, 2]) - np.maximum(b[0], bs[:, 0]), 0.0, None)
    ih = np.clip(np.minimum(b[3], bs[:, 3]) - np.maximum(b[1], bs[:, 1]), 0.0, None)
    inter = iw * ih
    area = max(b[2] - b[0], 0.0) * max(b[3] - b[1], 0.0)
    areas = np.clip(bs[:, 2] - bs[:, 0], 0.0, None) * np.clip(bs[:, 3] - bs[:, 1], 0.0, None)
    union = area + areas - inter
    out = np.zeros(len(bs), dtype=np.float64)
    np.divide(inter, union, out=out, where=union > 0)
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
