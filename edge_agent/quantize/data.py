"""Calibration data from files or from what a pipeline captured on this device.

`--data` takes an image folder, a video file, a WAV file or folder of WAVs, or
`pipeline:<id>`: the frames that pipeline's capture sink kept, in the state
folder (`Layout.captures`), where they survive a cache wipe. Long sources are
sampled evenly, never just their start, so the calibration set sees the whole
day rather than its first minute.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import cv2
import numpy as np
import numpy.typing as npt
from pydantic import ValidationError

from edge_agent.audio.resample import resample
from edge_agent.audio.wav import WavError, read_wav, to_mono, wav_length
from edge_agent.catalog.catalog import ResolvedModel
from edge_agent.catalog.manifest import AudioInput, ImageInput, Manifest
from edge_agent.config_files import RECORDED
from edge_agent.errors import EdgeAgentError
from edge_agent.logs import log_event
from edge_agent.paths import Layout, is_safe_name
from edge_agent.pipelines.capture import CaptureSinkSpec
from edge_agent.pipelines.decode import read_image_file, require_utf8_path
from edge_agent.quantize.recipe import Recipe, load_recipe
from edge_agent.runtime.preprocess import fit_whole_frame

if TYPE_CHECKING:
    from edge_agent.quantize.calibrate import CalibrationData

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp"}
VIDEO_SUFFIXES = {".avi", ".mp4", ".mkv", ".mov", ".webm", ".m4v"}
AUDIO_SUFFIXES = {".wav", ".wave"}
AUDIO_STRETCH_S = 10.0
"""Seconds of each stretch kept of recordings over a recipe's `max_audio_s`: enough for a
VAD's state to settle and to hold both speech and pauses."""

log = logging.getLogger(__name__)
_T = TypeVar("_T")


Recorded = Callable[[str], dict[str, Any] | None]
"""The spec the agent's record holds for a pipeline id, or None: passed in by the agent
(its record in memory) and the CLI (`agent.records.recorded_spec`, the file), as
calibration sits below the agent."""


def _none_recorded(pipeline: str) -> dict[str, Any] | None:
    return None


def resolve_data(text: str, layout: Layout, recorded: Recorded = _none_recorded) -> Path:
    """The path behind a `--data` argument; `recorded` finds a pipeline's own capture
    folder in the agent's record.

    Raises:
        EdgeAgentError: input.invalid for a bad pipeline id, input.not_found when
            the path is missing or the pipeline has captured nothing yet.
    """
    if text.startswith("pipeline:"):
        pipeline = text.partition(":")[2]
        if not is_safe_name(pipeline):
            raise EdgeAgentError(
                f"bad pipeline id {pipeline!r} in --data",
                "write pipeline:<id> with the id from the pipeline's spec",
                "input.invalid",
            )
        folder = capture_folder(pipeline, layout, recorded)
        if not folder.is_dir() or not any(folder.iterdir()):
            raise EdgeAgentError(
                f"pipeline {pipeline!r} has captured nothing yet ({folder})",
                "add a capture sink to its spec and let it run first",
                "input.not_found",
            )
        return folder
    path = Path(text)
    if not path.exists():
        raise EdgeAgentError(
            f"calibration data {path} does not exist", "check the path", "input.not_found"
        )
    return path


def capture_folder(pipeline: str, layout: Layout, recorded: Recorded = _none_recorded) -> Path:
    """Where `pipeline`'s capture sink writes: the `folder` its spec names, in the agent's
    record of it, else the pipeline's captures folder in the state.

    Warns when the pipeline detects on tiles or regions: calibration and its gate see
    whole frames fitted to the model, not the crops it serves on.
    """
    from edge_agent.pipelines.spec import PipelineSpec

    data = recorded(pipeline)
    try:
        # From the record: read as the agent's restore reads it (`RECORDED`).
        context = {RECORDED: True}
        spec = PipelineSpec.model_validate({"sinks": [], **data}, context=context) if data else None
    except ValidationError:
        spec = None  # the agent reports a spec it cannot run; its captures may still be here
    if spec is None:
        return layout.captures(pipeline)
    if spec.detect.mode != "frame":
        log_event(
            log, logging.WARNING, "calibration_whole_frames", pipeline=pipeline,
            mode=spec.detect.mode,
            detail="the pipeline detects on tiles or regions; calibration and its accuracy "
            "gate judge the model on whole frames fitted to its input, which it does not serve",
        )  # fmt: skip
    folders = [s.folder for s in spec.sinks if isinstance(s, CaptureSinkSpec) and s.folder]
    return folders[0] if folders else layout.captures(pipeline)


def _evenly(items: list[_T], limit: int) -> list[_T]:
    if len(items) <= limit:
        return items
    picks = np.linspace(0, len(items) - 1, limit).round().astype(int)
    return [items[i] for i in picks]


def load_frames(path: Path, limit: int, spec: ImageInput) -> list[npt.NDArray[np.uint8]]:
    """Up to `limit` frames from an image, a folder of images, or a video file, each
    fitted to the model's input (`spec`) as it is read: uint8 BGR at the model's size.

    Each decoded frame is dropped once fitted: 300 1080p captures held whole were 1.9 GB
    beside the live pipelines, where the model sees 300 x 1.2 MB (text-det-ppocr). The
    gate needs nothing of the whole frame: it decodes both models' answers in the
    model's input coordinates (`Task.decode`).
    """
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        videos = sorted(p for p in path.iterdir() if p.suffix.lower() in VIDEO_SUFFIXES)
        frames = [f for f in (_read_image(p, spec) for p in _evenly(files, limit)) if f is not None]
        for video in videos:
            frames += _video_frames(video, max(1, limit // max(1, len(videos))), spec)
    elif path.suffix.lower() in VIDEO_SUFFIXES:
        frames = _video_frames(path, limit, spec)
    else:
        image = _read_image(path, spec)
        frames = [image] if image is not None else []
    if not frames:
        raise EdgeAgentError(
            f"no readable images or video frames in {path}",
            "pass a folder of images, a video file, or pipeline:<id>",
            "input.unreadable",
        )
    return frames[:limit]


def load_clips(path: Path, rate: int, max_seconds: float) -> list[npt.NDArray[np.float32]]:
    """Mono clips at `rate` from a WAV file or a folder of them, `max_seconds` at most.

    Recordings longer than that in all give stretches of `AUDIO_STRETCH_S` (each a clip of
    its own, a VAD's state starting afresh), centred at even steps along the recordings
    end to end: an hour of audio was read whole and every 32 ms window of it calibrated
    and gated, 112k windows in the agent's memory beside its pipelines.
    """
    files = (
        sorted(p for p in path.iterdir() if p.suffix.lower() in AUDIO_SUFFIXES)
        if path.is_dir()
        else [path]
    )
    if not files:
        raise EdgeAgentError(
            f"no WAV files in {path}", "pass a .wav file or a folder of them", "input.not_found"
        )
    budget = max(1, round(max_seconds * rate))
    # Lengths from the headers first: each recording is then decoded once, whole when
    # they all fit the budget, else only for its stretches.
    lengths: list[int] = []
    for file in files:
        frames, source_rate = _clip_length(file, rate)
        lengths.append(round(frames * rate / source_rate))
    if sum(lengths) <= budget:
        return [resample(*_read_clip(file, rate), rate) for file in files]
    stretch = min(round(AUDIO_STRETCH_S * rate), budget)
    kept: list[npt.NDArray[np.float32]] = []
    for file, ranges in zip(files, _stretches(lengths, budget, stretch), strict=True):
        if ranges:
            samples, source_rate = _read_clip(file, rate)
            clip = resample(samples, source_rate, rate)
            del samples
            kept += [clip[first:end].copy() for first, end in ranges]  # not views of it all
    log.info(
        "event=calibration_audio_sampled files=%d total_s=%.0f kept_s=%.0f stretches=%d",
        len(files), sum(lengths) / rate, sum(len(c) for c in kept) / rate, len(kept),
    )  # fmt: skip
    return kept


def _unreadable(file: Path, exc: Exception) -> EdgeAgentError:
    return EdgeAgentError(
        f"cannot read {file}: {exc}", "replace or remove that file", "input.unreadable"
    )


def _clip_length(file: Path, rate: int) -> tuple[int, int]:
    try:
        return wav_length(file, rate)
    except (WavError, OSError) as exc:
        raise _unreadable(file, exc) from None


def _read_clip(file: Path, rate: int) -> tuple[npt.NDArray[np.float32], int]:
    try:
        samples, source_rate = read_wav(file, rate)
    except (WavError, OSError) as exc:
        raise _unreadable(file, exc) from None
    return to_mono(samples), source_rate


def _stretches(lengths: list[int], budget: int, stretch: int) -> list[list[tuple[int, int]]]:
    """The (first, end) sample ranges to keep of each recording: `budget // stretch`
    stretches, centred at even steps along all of them end to end."""
    total = sum(lengths)
    count = max(1, budget // stretch)
    starts = np.cumsum([0, *lengths[:-1]])
    picks: list[list[tuple[int, int]]] = [[] for _ in lengths]
    for k in range(count):
        centre = (k + 0.5) * total / count
        i = int(np.searchsorted(starts, centre, side="right")) - 1  # the file holding it
        first = min(max(0, round(centre - starts[i] - stretch / 2)), max(0, lengths[i] - stretch))
        picks[i].append((first, min(lengths[i], first + stretch)))
    return picks


def _read_image(path: Path, spec: ImageInput) -> npt.NDArray[np.uint8] | None:
    # Bytes decoded as a folder source decodes them: cv2.imread segfaults on a name that is
    # not UTF-8 and raises on an oversized image, where a bad file should only be passed over.
    image = read_image_file(path)[0]
    return None if image is None else fit_whole_frame(image, spec)


def _video_frames(path: Path, limit: int, spec: ImageInput) -> list[npt.NDArray[np.uint8]]:
    require_utf8_path(path)  # OpenCV segfaults on a name that is not UTF-8
    capture = cv2.VideoCapture(str(path))
    try:
        total = int(capture.get(cv2.CAP_PROP_FRAME_COUNT))
        # Frames evenly spaced over the whole file, decoded in one pass. A step of
        # total // limit rounded down to 1 under twice the limit: a 20 s clip gave only its
        # first 10 s, and a person walking in later was never seen by the gate.
        wanted = _evenly(list(range(total)), limit) if total > 0 else list(range(limit))
        keep = set(wanted)
        last = wanted[-1] if wanted else -1
        frames: list[npt.NDArray[np.uint8]] = []
        index = 0
        while len(frames) < limit and index <= last:
            if not capture.grab():
                break
            if index in keep:
                ok, frame = capture.retrieve()
                if ok:
                    frames.append(fit_whole_frame(np.asarray(frame, dtype=np.uint8), spec))
            index += 1
        return frames
    finally:
        capture.release()


def calibration_data(source: Path, manifest: Manifest, recipe: Recipe) -> CalibrationData:
    """The samples `calibrate` takes, from `source` as the model's input kind needs them.

    One place for the CLI and the agent's `calibrate` command alike.
    """
    from edge_agent.quantize.calibrate import CalibrationData  # NNCF loads only here

    spec = manifest.input
    if isinstance(spec, AudioInput):
        return CalibrationData([], load_clips(source, spec.sample_rate, recipe.max_audio_s))
    return CalibrationData(load_frames(source, recipe.max_samples, spec), [])


def refuse_calibrated(resolved: ResolvedModel) -> None:
    """Refuse a model that is itself a calibration's output as the FP32 reference.

    Its compressed weights would pass for FP32: every generation could lose another
    max_drop against the one before while each report said the drop was small, and a
    fallback to "fp32" would pin f32 on INT8 weights.

    Raises:
        EdgeAgentError: config.invalid, naming the model to calibrate instead.
    """
    done = resolved.manifest.quantization
    if done is not None:
        name = resolved.manifest.name
        raise EdgeAgentError(
            f"{name} at {resolved.path} is already calibrated ({done.mode}) and cannot be "
            "the FP32 reference of another calibration",
            f"calibrate the FP32 model it came from (--model {name}, or the original file)",
            "config.invalid",
        )


def reference_recipe(model: str) -> Path:
    """Where the reference recipe of `model` is (it may not exist)."""
    from edge_agent.reference import reference_dir

    return reference_dir("calibration") / f"{model}.toml"


def recipe_for(manifest: Manifest, explicit: Path | None = None) -> Recipe:
    """The recipe a calibration uses: `explicit`, else the model's reference recipe, else
    the defaults."""
    if explicit is not None:
        return load_recipe(explicit)
    reference = reference_recipe(manifest.name)
    return load_recipe(reference) if reference.is_file() else Recipe()
