"""BlazeFace (MediaPipe short-range face detector) head.

The model regresses 896 SSD anchors; each gives a box and six landmarks (eyes,
nose tip, mouth, ear tragions) in input pixels relative to its anchor, and one
logit. Overlapping detections are blended rather than suppressed, as MediaPipe
does, which steadies the box from frame to frame.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field

from edge_agent.heads.base import Detection, FloatArray, Outputs, Result, pick
from edge_agent.heads.boxes import iou

_KEYPOINTS = 6
_VALUES = 4 + 2 * _KEYPOINTS


class BlazeFaceConfig(BaseModel):
    """How to decode a BlazeFace short-range model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["blazeface"] = Field(default="blazeface", description="Head discriminator.")
    regressors: str = Field(
        default="regressors", description="Output holding box and keypoint regressions [1,896,16]."
    )
    scores: str = Field(default="classificators", description="Output holding logits [1,896,1].")
    input_size: int = Field(
        default=128, gt=0, description="Side of the square model input, in pixels."
    )
    score_threshold: float = Field(
        default=0.5, ge=0.0, le=1.0, description="Keep detections scoring above this."
    )
    iou_threshold: float = Field(
        default=0.3, ge=0.0, le=1.0, description="Blend detections overlapping more than this."
    )
    label: str = Field(default="face", description="Label given to every detection.")


def ssd_anchors_128() -> FloatArray:
    """Anchor centres of MediaPipe's short-range face detector.

    Strides 8, 16, 16, 16 with two anchors per layer; layers of equal stride share
    one grid, so a 16x16 grid has 2 anchors a cell and an 8x8 grid has 6.

    Returns:
        Shape [896, 2], (x_center, y_center) normalised to [0, 1], in the model's order.
    """
    grids: list[FloatArray] = []
    for cells, per_cell in ((16, 2), (8, 6)):
        centres = (np.arange(cells, dtype=np.float32) + 0.5) / cells
        ys, xs = np.meshgrid(centres, centres, indexing="ij")
        grid = np.stack([xs.ravel(), ys.ravel()], axis=1)
        grids.append(np.repeat(grid, per_cell, axis=0))
    return np.concatenate(grids).astype(np.float32)


_ANCHORS = ssd_anchors_128()


def _blend(
    boxes: npt.NDArray[np.float64], scores: npt.NDArray[np.float64], iou_threshold: float
) -> list[tuple[npt.NDArray[np.float64], float]]:
    """MediaPipe's weighted NMS: average each cluster of overlaps, weighted by score.

    `boxes` rows are x_min, y_min, x_max, y_max followed by any keypoint coordinates;
    only the first four decide overlap, but all are averaged.
    """
    order = np.argsort(-scores, kind="stable")
    blended: list[tuple[npt.NDArray[np.float64], float]] = []
    while order.size:
        overlaps = iou(boxes[order[0], :4], boxes[order, :4]) > iou_threshold
        # The leader always belongs to its own cluster, even if its box has NaN coordinates.
        overlaps[0] = True
        cluster = order[overlaps]
        weights = scores[cluster]
        mean = (boxes[cluster] * weights[:, None]).sum(axis=0) / weights.sum()
        blended.append((mean, float(scores[order[0]])))
        order = order[~overlaps]
    return blended


def decode_blazeface(
    regressors: npt.NDArray[np.generic],
    logits: npt.NDArray[np.generic],
    input_size: tuple[int, int],
    config: BlazeFaceConfig,
) -> list[Detection]:
    """Turn raw BlazeFace outputs into face detections in model-input pixels.

    Args:
        regressors: [896, 16] or [1, 896, 16], in model-input pixels relative to anchors.
        logits: [896, 1] or [1, 896, 1].
        input_size: (width, height) of the model input the coordinates are scaled to.
        config: thresholds and label.

    Returns:
        Detections, highest score first, with six keypoints each.
    """
    reg = np.asarray(regressors, dtype=np.float64).reshape(-1, _VALUES)
    raw = np.asarray(logits, dtype=np.float64).reshape(-1)
    if len(reg) != len(_ANCHORS) or len(raw) != len(_ANCHORS):
        raise ValueError(
            f"BlazeFace expects {len(_ANCHORS)} anchors; got {len(reg)} regressions "
            f"and {len(raw)} scores"
        )
    # Clipping keeps exp() from overflowing on saturated logits.
    scores = 1.0 / (1.0 + np.exp(-np.clip(raw, -100.0, 100.0)))
    keep = scores > config.score_threshold
    if not keep.any():
        return []
    reg, scores = reg[keep], scores[keep]
    anchors = _ANCHORS[keep].astype(np.float64)

    # Every x offset is relative to the anchor's x, every y offset to its y.
    points = reg / config.input_size
    points[:, 4:] += np.tile(anchors, _KEYPOINTS)
    cx, cy = points[:, 0] + anchors[:, 0], points[:, 1] + anchors[:, 1]
    half_w, half_h = points[:, 2] / 2, points[:, 3] / 2
    rows = np.concatenate(
        [np.stack([cx - half_w, cy - half_h, cx + half_w, cy + half_h], axis=1), points[:, 4:]],
        axis=1,
    )

    width, height = input_size
    # Outputs are normalised to the input, each axis on its own.
    scale = np.tile(np.array([width, height], dtype=np.float64), 2 + _KEYPOINTS)
    detections: list[Detection] = []
    for row, score in _blend(rows, scores, config.iou_threshold):
        px = row * scale
        x1, x2 = np.clip(px[[0, 2]], 0.0, width)
        y1, y2 = np.clip(px[[1, 3]], 0.0, height)
        if not (x2 > x1 and y2 > y1):  # so that a NaN coordinate fails it too
            continue
        keypoints = tuple((float(x), float(y)) for x, y in px[4:].reshape(-1, 2))
        detections.append(
            Detection(
                label=config.label,
                class_id=0,
                score=score,
                box=(float(x1), float(y1), float(x2), float(y2)),
                keypoints=keypoints,
            )
        )
    return detections


class BlazeFaceHead:
    """FrameHead for BlazeFace models."""

    def __init__(self, config: BlazeFaceConfig) -> None:
        self.config = config

    def decode(self, outputs: Outputs, input_size: tuple[int, int]) -> list[Result]:
        regressors = pick(outputs, self.config.regressors, "regressors")
        logits = pick(outputs, self.config.scores, "scores")
        return [*decode_blazeface(regressors, logits, input_size, self.config)]
