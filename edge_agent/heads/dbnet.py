"""DBNet text-detection head (PP-OCR det models), after PaddleOCR's DBPostProcess.

The model outputs a per-pixel text probability. Regions above a pixel threshold
become contours; each contour's rotated rectangle is scored by the mean
probability inside it, then grown ("unclipped") because DBNet is trained to
predict a shrunk text kernel.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import cv2
import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field

from edge_agent.heads.base import Outputs, Result, TextBox, pick

Corners = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


class DbnetConfig(BaseModel):
    """How to decode a DBNet probability map."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["dbnet"] = Field(default="dbnet", description="Head discriminator.")
    output: str = Field(
        default="sigmoid_0.tmp_0", description="Output holding the probability map [1,1,H,W]."
    )
    pixel_threshold: float = Field(
        default=0.3,
        ge=0.0,
        le=1.0,
        description="A pixel is text when its probability exceeds this.",
    )
    box_threshold: float = Field(
        default=0.5, ge=0.0, le=1.0, description="Keep regions whose mean probability reaches this."
    )
    unclip_ratio: float = Field(
        default=1.6, gt=0.0, description="How far to grow each region back from the shrunk kernel."
    )
    dilate: bool = Field(
        default=True, description="Dilate the bitmap with a 2x2 kernel to join broken strokes."
    )
    min_size: float = Field(
        default=3.0,
        ge=0.0,
        description="Drop regions whose short side is below this, in map pixels.",
    )
    max_candidates: int = Field(
        default=1000, gt=0, description="Look at no more than this many contours."
    )


def _rect_corners(centre: Sequence[float], size: tuple[float, float], angle: float) -> Corners:
    """Corners of a rotated rectangle, ordered top-left, top-right, bottom-right, bottom-left."""
    pts = np.asarray(cv2.boxPoints(((centre[0], centre[1]), size, angle)), dtype=np.float64)
    pts = pts[np.argsort(pts[:, 0], kind="stable")]
    left, right = pts[:2], pts[2:]
    tl, bl = left[np.argsort(left[:, 1], kind="stable")]
    tr, br = right[np.argsort(right[:, 1], kind="stable")]
    return np.stack([tl, tr, br, bl])


def _mean_inside(prob: npt.NDArray[np.float32], corners: Corners) -> float:
    """Mean probability inside a polygon, over its bounding crop only (PaddleOCR's "fast" score)."""
    height, width = prob.shape
    x0 = int(np.clip(np.floor(corners[:, 0].min()), 0, width - 1))
    x1 = int(np.clip(np.ceil(corners[:, 0].max()), 0, width - 1))
    y0 = int(np.clip(np.floor(corners[:, 1].min()), 0, height - 1))
    y1 = int(np.clip(np.ceil(corners[:, 1].max()), 0, height - 1))
    mask = np.zeros((y1 - y0 + 1, x1 - x0 + 1), dtype=np.uint8)
    # Truncating to int, as PaddleOCR does, keeps scores comparable with its thresholds.
    shifted = (corners - [x0, y0]).astype(np.int32)
    cv2.fillPoly(mask, [shifted], 1)
    inside = mask.astype(bool)
    return float(prob[y0 : y1 + 1, x0 : x1 + 1][inside].mean()) if inside.any() else 0.0


def decode_dbnet(
    prob: npt.NDArray[np.generic], input_size: tuple[int, int], config: DbnetConfig
) -> list[TextBox]:
    """Find text regions in a DBNet probability map.

    Args:
        prob: probability map, [1, 1, H, W] or [H, W].
        input_size: (width, height) of the model input (the map may be smaller).
        config: thresholds.

    Returns:
        Text boxes with corners in model-input pixels, clockwise from top-left, clipped to it.
    """
    probs = np.asarray(prob, dtype=np.float32)
    if probs.ndim == 4 and probs.shape[:2] == (1, 1):
        probs = probs[0, 0]
    if probs.ndim != 2:
        raise ValueError(f"DBNet expects a [1,1,H,W] or [H,W] map; got shape {prob.shape}")
    map_h, map_w = probs.shape
    bitmap = (probs > config.pixel_threshold).astype(np.uint8)
    if config.dilate:
        bitmap = np.asarray(cv2.dilate(bitmap, np.ones((2, 2), dtype=np.uint8)), dtype=np.uint8)
    contours, _ = cv2.findContours(bitmap, cv2.RETR_LIST, cv2.CHAIN_APPROX_SIMPLE)

    width, height = input_size
    scale = np.array([width / map_w, height / map_h])
    boxes: list[TextBox] = []
    for contour in contours[: config.max_candidates]:
        centre, (w, h), angle = cv2.minAreaRect(contour)
        if min(w, h) < config.min_size:
            continue
        score = _mean_inside(probs, _rect_corners(centre, (w, h), angle))
        if score < config.box_threshold:
            continue
        # Offsetting a rectangle by d (pyclipper's job in PaddleOCR) grows each side by 2d;
        # the round corners it adds do not change the minimum-area rectangle.
        distance = w * h * config.unclip_ratio / (2 * (w + h))
        grown = (w + 2 * distance, h + 2 * distance)
        if min(grown) < config.min_size + 2:
            continue
        corners = _rect_corners(centre, grown, angle) * scale
        corners = np.clip(corners, 0.0, [width, height])
        boxes.append(
            TextBox(
                score=min(score, 1.0),
                polygon=tuple((float(x), float(y)) for x, y in corners),
            )
        )
    return boxes


def text_mask(boxes: Sequence[TextBox], frame_size: tuple[int, int]) -> BoolArray:
    """Rasterise text boxes into a mask of the frame.

    Args:
        boxes: text boxes in frame pixels.
        frame_size: (width, height).

    Returns:
        Boolean array of shape (height, width), True inside any box.
    """
    width, height = frame_size
    mask = np.zeros((height, width), dtype=np.uint8)
    polygons = [np.round(np.asarray(b.polygon)).astype(np.int32) for b in boxes]
    if polygons:
        cv2.fillPoly(mask, polygons, 1)
    return mask.astype(bool)


def mask_f1(a: BoolArray, b: BoolArray) -> float:
    """F1 (Dice) overlap of two masks of the same shape; 1.0 when both are empty."""
    if a.shape != b.shape:
        raise ValueError(f"masks differ in shape: {a.shape} vs {b.shape}")
    total = int(a.sum()) + int(b.sum())
    if total == 0:
        return 1.0
    return 2.0 * int(np.logical_and(a, b).sum()) / total


class DbnetHead:
    """FrameHead for DBNet text detectors."""

    def __init__(self, config: DbnetConfig) -> None:
        self.config = config

    def decode(self, outputs: Outputs, input_size: tuple[int, int]) -> list[Result]:
        return [*decode_dbnet(pick(outputs, self.config.output), input_size, self.config)]
