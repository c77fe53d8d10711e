"""Agreement metrics: how closely a compressed model's decoded answers match FP32's.

Pure functions over decoded results (or raw tensors). Where the device has no
labels, the FP32 model's own answers are the reference, so every metric is in
[0, 1] with 1.0 meaning "answers exactly as FP32 does".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

import numpy as np
import numpy.typing as npt

from edge_agent.heads.base import Classification, Detection, Result, TextBox
from edge_agent.heads.boxes import iou
from edge_agent.heads.dbnet import mask_f1, text_mask

MetricName = Literal[
    "detection-f1", "top1-agreement", "text-mask-f1", "speech-balanced-accuracy", "cosine"
]


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


def speech_balanced_accuracy(
    reference: npt.NDArray[np.floating], candidate: npt.NDArray[np.floating], threshold: float
) -> float:
    """Mean of the candidate's agreement with FP32 on FP32's speech windows and on its
    non-speech windows (balanced accuracy, FP32's verdicts as the truth).

    Plain agreement over windows is mostly silence on a quiet site's microphone, so a VAD
    that never flags speech agreed on 99% of them and passed a 0.01 gate. Balanced accuracy
    scores that model 0.5 whatever the mix. It is chosen over speech F1, which also fails it,
    because F1 ignores agreement on silence: its value for the same error rates moves with
    how much of the recording was speech, and false alarms in silence only count relative
    to the speech there was.

    Args:
        reference: FP32's speech probabilities, one per window.
        candidate: the same windows scored by the compressed model.
        threshold: a window is speech at this probability or above.

    Returns:
        In [0, 1]; a class FP32 never found is left out, and 1.0 for two empty streams
        (the gate refuses a holdout without enough of each class before it gets here).
    """
    ref, cand = np.asarray(reference).reshape(-1), np.asarray(candidate).reshape(-1)
    if ref.shape != cand.shape:
        raise ValueError(f"probability streams differ in length: {len(ref)} vs {len(cand)}")
    speech, said = ref >= threshold, cand >= threshold
    rates = [float(np.mean(said[cls] == speech[cls])) for cls in (speech, ~speech) if cls.any()]
    return float(np.mean(rates)) if rates else 1.0


def cosine_all(
    reference: Mapping[str, npt.NDArray[np.generic]],
    candidate: Mapping[str, npt.NDArray[np.generic]],
) -> float:
    """Cosine similarity of the worst-agreeing output of one inference.

    The minimum, not the mean: a model is as broken as its most broken output (a detector
    whose scores flipped sign is useless however well its boxes match), and a mean over
    several healthy outputs would dilute that one towards a pass.
    """
    return min((cosine(reference[k], candidate[k]) for k in sorted(reference)), default=1.0)
