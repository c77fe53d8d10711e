"""Per-task glue for calibration: samples in, decoded answers out, one metric.

An image model's samples are frames fitted to its input, made its tensor
exactly as the runtime would (runtime.preprocess, the numpy twin of the folded
graph) only when fed: a text-det-ppocr float tensor is four times its uint8
frame, and 300 of them held at once were 1.5 GB. A stateful
VAD's samples are (window, state) pairs recorded while the FP32 model runs
over the audio, since a window alone is not what the model sees; the gate then
replays held-out audio end to end, carrying each model's own state.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from edge_agent.catalog.manifest import ImageInput, Manifest
from edge_agent.errors import EdgeAgentError
from edge_agent.heads.base import Detection, Result, TextBox
from edge_agent.heads.blazeface import BlazeFaceConfig
from edge_agent.heads.classification import ClassificationConfig
from edge_agent.heads.dbnet import DbnetConfig
from edge_agent.heads.registry import build_frame_head
from edge_agent.heads.ssd import SsdConfig
from edge_agent.heads.vad import VadConfig, audio_windows
from edge_agent.heads.yolo import YoloConfig
from edge_agent.quantize import metrics
from edge_agent.quantize.recipe import MetricChoice
from edge_agent.runtime.preprocess import fit_frame, frame_tensor

Inputs = dict[str, npt.NDArray[np.generic]]
Outputs = dict[str, npt.NDArray[np.generic]]
DETECTION_BAND = 0.1
"""Scores this close to a detector's threshold are FP32's own doubt, not a verdict."""
Sample = Inputs | npt.NDArray[np.uint8]
"""One calibration or held-out item: an image model's frame at its input size, or a
VAD's inputs; `Task.feed` makes it the model's inputs."""
Runner = Callable[[Inputs], Outputs]
"""Runs one inference on a compiled model; outputs keyed by every output name."""
MIN_HELD_FRAMES = 4
"""Held-out frames below which a drop of a few hundredths is noise, not a verdict."""
MIN_HELD_WINDOWS = 64
"""Held-out VAD windows (2 s of 32 ms windows) below which the gate cannot judge."""
MIN_EVIDENCE = 3
"""Boxes FP32 is sure of (or text boxes) that the held-out frames must hold: with none,
any model that also finds nothing, even one that outputs zeros, agrees with FP32 perfectly."""
MIN_EVIDENCE_WINDOWS = 16
"""Speech windows, and non-speech windows, a VAD's holdout must hold (half a second each)."""


def auto_metric(manifest: Manifest) -> str:
    """The agreement metric that fits the model's head."""
    head = manifest.head
    if isinstance(head, SsdConfig | BlazeFaceConfig | YoloConfig):
        return "detection-f1"
    if isinstance(head, ClassificationConfig):
        return "top1-agreement"
    if isinstance(head, DbnetConfig):
        return "text-mask-f1"
    if isinstance(head, VadConfig):
        return "speech-balanced-accuracy"
    return "cosine"


def check_metric(manifest: Manifest, metric: MetricChoice) -> str:
    """The metric a recipe's `metric` means for `manifest` ("auto" resolved).

    Raises:
        EdgeAgentError: config.invalid when it does not fit the model's head.
    """
    # Cosine compares raw outputs and fits any model; the others decode with one kind of head.
    fits = auto_metric(manifest)
    chosen = fits if metric == "auto" else metric
    if chosen not in (fits, "cosine"):
        raise EdgeAgentError(
            f"recipe metric {chosen!r} does not fit {manifest.name}'s {manifest.head.type} head",
            f'use metric = "{fits}" or "auto" in the recipe',
            "config.invalid",
        )
    return chosen


@dataclass(frozen=True, slots=True)
class Task:
    """How to feed, run and score one model."""

    manifest: Manifest
    metric: str
    calibration: list[Sample]
    holdout: list[Sample]
    state_shape: tuple[int, ...] | None = None
    """A stateful model's recurrent state shape (it starts at zeros)."""

    def feed(self, sample: Sample) -> Inputs:
        """The model's inputs for one sample (an image model's tensor, made anew)."""
        if isinstance(sample, dict):
            return sample
        spec = self.manifest.input
        assert isinstance(spec, ImageInput)
        return {spec.name: frame_tensor(sample, spec)}

    def run(self, runner: Runner, items: Sequence[Sample]) -> list[Outputs]:
        """Run each held-out item; a VAD carries its own state through the sequence."""
        head = self.manifest.head
        if not isinstance(head, VadConfig):
            return [runner(self.feed(item)) for item in items]
        assert self.state_shape is not None
        state = np.zeros(self.state_shape, dtype=np.float32)
        found = []
        for item in items:
            assert isinstance(item, dict)
            outputs = runner({head.audio_input: item[head.audio_input], head.state_in: state})
            state = np.asarray(outputs[head.state_out], dtype=np.float32)
            found.append(outputs)
        return found

    def decode(self, outputs: Sequence[Outputs]) -> list[list[Result]]:
        spec = self.manifest.input
        assert isinstance(spec, ImageInput)
        config = self.manifest.head
        if isinstance(config, SsdConfig | BlazeFaceConfig | YoloConfig):
            # Decode below the operating threshold, so detection_f1 can see FP32's doubts.
            low = max(0.0, config.score_threshold - DETECTION_BAND)
            config = config.model_copy(update={"score_threshold": low})
        head = build_frame_head(config)
        return [list(head.decode(o, (spec.width, spec.height))) for o in outputs]

    def score(self, reference: Sequence[Outputs], candidate: Sequence[Outputs]) -> float:
        """The gate metric of `candidate` against the FP32 `reference`, in [0, 1]."""
        return self.per_item(reference, candidate)[0]

    def per_item(
        self, reference: Sequence[Outputs], candidate: Sequence[Outputs]
    ) -> tuple[float, list[float]]:
        """The metric over all items, and each item's own score (NNCF ranks layers by it).

        A candidate that outputs NaN or inf where FP32 does not scores 0: read through a
        head, NaN compares false with every threshold and passed as "no box, no speech".
        """
        if non_finite(reference, candidate):
            return 0.0, [0.0] * len(candidate)
        head = self.manifest.head
        name = self.metric
        if name == "speech-balanced-accuracy":
            assert isinstance(head, VadConfig)
            a, b = _speech(reference, head), _speech(candidate, head)
            each = ((a >= head.threshold) == (b >= head.threshold)).astype(float).tolist()
            return metrics.speech_balanced_accuracy(a, b, head.threshold), each
        if name == "cosine":
            each = [metrics.cosine_all(r, c) for r, c in zip(reference, candidate, strict=True)]
            return (float(np.mean(each)) if each else 1.0), each
        ref, cand = self.decode(reference), self.decode(candidate)
        spec = self.manifest.input
        assert isinstance(spec, ImageInput)
        if name == "detection-f1":
            head_config = self.manifest.head
            assert isinstance(head_config, SsdConfig | BlazeFaceConfig | YoloConfig)
            t, band = head_config.score_threshold, DETECTION_BAND
            each = [metrics.detection_f1([r], [c], t, band) for r, c in zip(ref, cand, strict=True)]
            return metrics.detection_f1(ref, cand, t, band), each
        if name == "top1-agreement":
            each = [metrics.top1_agreement([r], [c]) for r, c in zip(ref, cand, strict=True)]
            return metrics.top1_agreement(ref, cand), each
        if name == "text-mask-f1":
            size = (spec.width, spec.height)
            each = [metrics.text_mask_f1([r], [c], size) for r, c in zip(ref, cand, strict=True)]
            return (float(np.mean(each)) if each else 1.0), each
        raise ValueError(f"unknown metric {name}")

    def require_evidence(self, reference: Sequence[Outputs]) -> None:
        """Refuse a holdout in which FP32 found too little for the metric to judge by.

        Detection and text F1 are 1.0 when neither side finds anything, and a VAD's
        balanced accuracy needs both classes: on a capture of an empty scene or of
        silence, any model, a broken one included, would pass.

        Raises:
            EdgeAgentError: calibration.failed, naming what was found and the minimum.
        """
        head = self.manifest.head
        name = self.metric
        if name == "speech-balanced-accuracy":
            assert isinstance(head, VadConfig)
            speech = int(np.sum(_speech(reference, head) >= head.threshold))
            silence = len(reference) - speech
            if min(speech, silence) < MIN_EVIDENCE_WINDOWS:
                raise EdgeAgentError(
                    f"cannot judge {self.manifest.name}: FP32 flags {speech} of the "
                    f"{len(reference)} held-out windows as speech and {silence} as not; the "
                    f"gate needs at least {MIN_EVIDENCE_WINDOWS} of each",
                    "record audio with both speech and pauses in it, or more of it",
                    "calibration.failed",
                )
            return
        if name not in ("detection-f1", "text-mask-f1"):
            return  # top-1 and cosine compare every item whatever it holds
        if isinstance(head, SsdConfig | BlazeFaceConfig | YoloConfig):
            # Boxes within the band are exempt from the metric: they are no evidence.
            sure = head.score_threshold + DETECTION_BAND
            found = sum(
                isinstance(d, Detection) and d.score >= sure
                for item in self.decode(reference)
                for d in item
            )
            what, fix = "objects", "capture while people or objects are in view, or more of it"
        else:
            found = sum(isinstance(d, TextBox) for item in self.decode(reference) for d in item)
            what, fix = "text boxes", "capture frames with text in view, or more of them"
        if found < MIN_EVIDENCE:
            raise EdgeAgentError(
                f"cannot judge {self.manifest.name}: FP32 finds {found} {what} in the "
                f"{len(reference)} held-out frames; the gate needs at least {MIN_EVIDENCE}",
                fix,
                "calibration.failed",
            )


def non_finite(reference: Sequence[Outputs], candidate: Sequence[Outputs]) -> int:
    """How many items the candidate answered with NaN or inf where FP32 did not."""
    return sum(
        any(
            bool(np.any(~np.isfinite(c[k]) & np.isfinite(r[k])))
            for k in r
            if np.issubdtype(np.asarray(r[k]).dtype, np.floating)
        )
        for r, c in zip(reference, candidate, strict=True)
    )


def _speech(outputs: Sequence[Outputs], head: VadConfig) -> npt.NDArray[np.float64]:
    return np.asarray(
        [float(np.asarray(o[head.probability]).reshape(-1)[0]) for o in outputs], dtype=np.float64
    )


def build_task(
    manifest: Manifest,
    frames: Sequence[npt.NDArray[np.uint8]],
    clips: Sequence[npt.NDArray[np.float32]],
    holdout: float,
    metric: MetricChoice,
    fp32: Runner,
    input_shapes: dict[str, tuple[int, ...]],
) -> Task:
    """Split frames fitted to the model's input, or audio clips, into calibration and
    held-out samples."""
    chosen = check_metric(manifest, metric)
    spec = manifest.input
    if isinstance(spec, ImageInput):
        # A no-op on frames `load_frames` fitted; a caller's whole frames are fitted once
        # here rather than at every rung.
        items: list[Sample] = [fit_frame(f, spec) for f in frames]
        # Interleave the split so both halves span the whole capture, not its two ends.
        stride = max(2, round(1 / holdout))
        held = items[::stride]
        calib = [x for i, x in enumerate(items) if i % stride]
        return _enough(Task(manifest, chosen, calib, held), stride)
    head = manifest.head
    assert isinstance(head, VadConfig)
    state_shape = input_shapes[head.state_in]
    # At least one clip on each side: 4 WAVs at holdout 0.1 used to hold out none.
    cut = min(len(clips) - 1, max(1, round(len(clips) * (1 - holdout))))
    windows = _recorded_windows(clips[:cut] if cut else clips, head, fp32, state_shape)
    held_windows: list[Inputs] = [
        {head.audio_input: w[None]}
        for c in clips[cut:]
        for w in audio_windows(c, head.window, head.context)
    ]
    if not cut:
        # One clip only: hold out its last third as its own sequence.
        split = int(len(windows) * (1 - holdout))
        held_windows = [{head.audio_input: x[head.audio_input]} for x in windows[split:]]
        windows = windows[:split]
    return _enough(Task(manifest, chosen, list(windows), list(held_windows), state_shape))


def _enough(task: Task, stride: int | None = None) -> Task:
    """`task`, unless its holdout is too small to judge by; `stride` is an image task's
    split (every stride-th frame held out)."""
    least = MIN_HELD_WINDOWS if task.state_shape is not None else MIN_HELD_FRAMES
    if task.calibration and len(task.holdout) >= least:
        return task
    counts = f"{len(task.calibration)} calibration and {len(task.holdout)} held-out"
    if stride is not None:
        frames = (least - 1) * stride + 1  # the fewest that hold out `least`
        raise EdgeAgentError(
            f"too little data to calibrate {task.manifest.name}: {counts} frames; the gate "
            f"needs at least {least} held out",
            f"give at least {frames} frames (a few hundred is better)",
            "calibration.failed",
        )
    head = task.manifest.head
    assert isinstance(head, VadConfig)
    seconds = least * head.window / head.sample_rate
    raise EdgeAgentError(
        f"too little audio to calibrate {task.manifest.name}: {counts} windows; the gate "
        f"needs at least {least} held out ({seconds:.1f} s)",
        "give longer recordings (a few minutes is better), or more WAV files",
        "calibration.failed",
    )


def _recorded_windows(
    clips: Sequence[npt.NDArray[np.float32]],
    head: VadConfig,
    fp32: Runner,
    state_shape: tuple[int, ...],
) -> list[Inputs]:
    found: list[Inputs] = []
    for clip in clips:
        state = np.zeros(state_shape, dtype=np.float32)
        for window in audio_windows(clip, head.window, head.context):
            feed: Inputs = {head.audio_input: window[None], head.state_in: state}
            found.append(feed)
            state = np.asarray(fp32(feed)[head.state_out], dtype=np.float32)
    return found
