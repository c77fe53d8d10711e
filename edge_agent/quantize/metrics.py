"""Agreement metrics: how closely a compressed model's decoded answers match FP32's.

Pure functions over decoded results (or raw tensors). Where the device has no
labels, the FP32 model's own answers are the reference, so every metric is in
[0, 1] with 1.0 meaning "answers exactly as FP32 does".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
import numpy.typing as npt

from edge_agent.heads.base import Classification, Detection, Result, TextBox
from edge_agent.heads.boxes import iou
from edge_agent.heads.dbnet import mask_f1, text_mask

MetricName = Literal["detection-f1", "top1-agreement", "text-mask-f1", "frame-agreement", "cosine"]


def detection_f1(
    reference: Sequence[Sequence[Result]],
    candidate: Sequence[Sequence[Result]],
    threshold: float = 0.0,
    band: float = 0.0,
    iou_at: float = 0.5,
) -> float:
    """Matched-box F1 over all frames, counting only disagreements FP32 is sure of.

    A candidate box matches a reference box of the same label with IoU >= `iou_at`
    (greedy by score, each reference once). Both sides should be decoded down to
    `threshold - band`. A pair that both report (score >= `threshold`) is a true
    positive; a box one side reports and the other misses counts against the
    candidate, except when the FP32 score lies within `band` of the threshold:
    FP32 was itself unsure there, and a flip is threshold jitter, not damage.

    Returns 1.0 when neither side reports anything at all.
    """
    low, high = threshold - band, threshold + band
    tp = fp = fn = 0
    for ref, cand in zip(reference, candidate, strict=True):
        ref_boxes = [d for d in ref if isinstance(d, Detection) and d.score >= low]
        cand_boxes = sorted(
            (d for d in cand if isinstance(d, Detection) and d.score >= low),
            key=lambda d: d.score,
            reverse=True,
        )
        unmatched = list(range(len(ref_boxes)))
        for det in cand_boxes:
            match = _best_match(det, ref_boxes, unmatched, iou_at)
            if match < 0:
                fp += det.score >= threshold
                continue
            unmatched.remove(match)
            r, c = ref_boxes[match].score, det.score
            if r >= threshold and c >= threshold:
                tp += 1
            elif (r >= threshold) != (c >= threshold) and not low <= r < high:
                fp += c >= threshold
                fn += r >= threshold
        fn += sum(ref_boxes[i].score >= max(threshold, high) for i in unmatched)
    if tp + fp + fn == 0:
        return 1.0
    return 2 * tp / (2 * tp + fp + fn)


def _best_match(det: Detection, refs: list[Detection], free: list[int], iou_at: float) -> int:
    best, best_iou = -1, iou_at
    box = np.asarray(det.box, dtype=np.float32)
    for i in free:
        if refs[i].label != det.label:
            continue
        overlap = float(iou(box, np.asarray([refs[i].box], dtype=np.float32))[0])
        if overlap >= best_iou:
            best, best_iou = i, overlap
    return best


def top1_agreement(
    reference: Sequence[Sequence[Result]], candidate: Sequence[Sequence[Result]]
) -> float:
    """Fraction of frames whose best class is the same."""

    def best(results: Sequence[Result]) -> int:
        classes = [r for r in results if isinstance(r, Classification)]
        return max(classes, key=lambda c: c.score).class_id if classes else -1

    pairs = list(zip(reference, candidate, strict=True))
    if not pairs:
        return 1.0
    return sum(best(a) == best(b) for a, b in pairs) / len(pairs)


def text_mask_f1(
    reference: Sequence[Sequence[Result]],
    candidate: Sequence[Sequence[Result]],
    frame_size: tuple[int, int],
) -> float:
    """Mean over frames of the F1 overlap of the text-box masks."""
    scores = [
        mask_f1(
            text_mask([b for b in a if isinstance(b, TextBox)], frame_size),
            text_mask([b for b in c if isinstance(b, TextBox)], frame_size),
        )
        for a, c in zip(reference, candidate, strict=True)
    ]
    return float(np.mean(scores)) if scores else 1.0


def cosine(a: npt.NDArray[np.generic], b: npt.NDArray[np.generic]) -> float:
    """Cosine similarity of two tensors, flattened; 1.0 for two all-zero tensors."""
    x = np.asarray(a, dtype=np.float64).reshape(-1)
    y = np.asarray(b, dtype=np.float64).reshape(-1)
    nx, ny = float(np.linalg.norm(x)), float(np.linalg.norm(y))
    if nx == 0.0 and ny == 0.0:
        return 1.0
    if nx == 0.0 or ny == 0.0:
        return 0.0
    return float(np.dot(x, y) / (nx * ny))
