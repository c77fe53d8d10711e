"""YOLO detection head for Ultralytics-style exports (v5, v8, v11) without built-in NMS.

v5 rows are (cx, cy, w, h, objectness, class scores...); v8 and v11 drop the
objectness and transpose the tensor to [1, 4 + C, N]. Boxes are in model-input
pixels; the caller's geometry maps them to the frame (Ultralytics letterboxes with 114).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field

from edge_agent.heads.base import Detection, Outputs, Result, pick
from edge_agent.heads.boxes import nms_per_class


class YoloConfig(BaseModel):
    """How to decode a YOLO detector's raw output."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["yolo"] = Field(default="yolo", description="Head discriminator.")
    output: str = Field(default="output0", description="Output holding the raw predictions.")
    layout: Literal["v5", "v8", "v11"] = Field(
        default="v8",
        description="v5: [1,N,5+C] with objectness; v8 and v11: [1,4+C,N] without.",
    )
    labels: list[str] = Field(min_length=1, description="Class names, in the model's order.")
    input_size: tuple[int, int] | None = Field(
        default=None,
        description="The (width, height) the output's boxes are measured in, when not the "
        "input the model ran on. Leave it unset for Ultralytics exports: their boxes are in "
        "the pixels of the input they ran on, whatever size it was exported or reshaped at.",
    )
    score_threshold: float = Field(
        default=0.25, ge=0.0, le=1.0, description="Keep detections scoring above this."
    )
    iou_threshold: float = Field(
        default=0.45, ge=0.0, le=1.0, description="Suppress same-class boxes overlapping more."
    )
    max_detections: int = Field(default=300, gt=0, description="Keep at most this many boxes.")


def _rows(raw: npt.NDArray[np.generic], config: YoloConfig) -> npt.NDArray[np.float64]:
    """Predictions as [N, 4 + C] rows of (cx, cy, w, h, class scores...)."""
    classes = len(config.labels)
    pred = np.asarray(raw, dtype=np.float64)
    if pred.ndim == 3 and pred.shape[0] == 1:
        pred = pred[0]
    if config.layout == "v5":
        if pred.ndim != 2 or pred.shape[1] != 5 + classes:
            raise ValueError(
                f"YOLOv5 output for {classes} classes should be [1,N,{5 + classes}]; "
                f"got {raw.shape}"
            )
        return np.concatenate([pred[:, :4], pred[:, 4:5] * pred[:, 5:]], axis=1)
    if pred.ndim != 2 or pred.shape[0] != 4 + classes:
        raise ValueError(
            f"YOLO{config.layout} output for {classes} classes should be "
            f"[1,{4 + classes},N]; got {raw.shape}"
        )
    return pred.T


def decode_yolo(
    raw: npt.NDArray[np.generic], input_size: tuple[int, int], config: YoloConfig
) -> list[Detection]:
    """Turn raw YOLO predictions into detections in model-input pixels.

    Args:
        raw: the model's output tensor, laid out as `config.layout` says.
        input_size: (width, height) of the input the model ran on.
        config: labels and thresholds.

    Returns:
        Detections after class-aware NMS, highest score first.
    """
    rows = _rows(raw, config)
    class_scores = rows[:, 4:]
    class_ids = class_scores.argmax(axis=1)
    scores = class_scores[np.arange(len(rows)), class_ids]
    keep = scores > config.score_threshold
    rows, class_ids, scores = rows[keep], class_ids[keep], scores[keep]
    if not len(rows):
        return []

    width, height = input_size
    # A default of 640x640 here scaled every box of a 320 px or 640x480 export, and of a
    # dynamic one run at another size, by the ratio of the two: boxes at half size.
    in_w, in_h = config.input_size or input_size
    cx, cy, half_w, half_h = rows[:, 0], rows[:, 1], rows[:, 2] / 2, rows[:, 3] / 2
    boxes = np.stack([cx - half_w, cy - half_h, cx + half_w, cy + half_h], axis=1)
    if (in_w, in_h) != (width, height):
        boxes *= [width / in_w, height / in_h, width / in_w, height / in_h]
    boxes = np.clip(boxes, 0.0, [width, height, width, height])
    # A box with no area inside the input is no detection; dropping it before NMS keeps it
    # from taking a place in the ranking.
    real = (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
    boxes, class_ids, scores = boxes[real], class_ids[real], scores[real]

    kept = nms_per_class(boxes, scores, class_ids, config.iou_threshold)
    detections: list[Detection] = []
    for i in kept[: config.max_detections]:
        x1, y1, x2, y2 = boxes[i]
        detections.append(
            Detection(
                label=config.labels[class_ids[i]],
                class_id=int(class_ids[i]),
                score=float(min(scores[i], 1.0)),
                box=(float(x1), float(y1), float(x2), float(y2)),
            )
        )
    return detections


class YoloHead:
    """FrameHead for YOLO detectors."""

    def __init__(self, config: YoloConfig) -> None:
        self.config = config

    def decode(self, outputs: Outputs, input_size: tuple[int, int]) -> list[Result]:
        return [*decode_yolo(pick(outputs, self.config.output), input_size, self.config)]
