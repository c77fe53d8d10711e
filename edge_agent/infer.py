"""One-shot inference on a file: an image through a frame head, a WAV through the VAD.

The manifest's `task` decides which: a `vad` model reads a WAV file, every
other task an image (the manifest itself checks that its input and head fit
its task). The CLI's `infer` and the tests use this; pipelines (streams, many
frames) build on the same pieces.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt

from edge_agent.audio.resample import resample
from edge_agent.audio.wav import WavError, load_wav, to_mono
from edge_agent.catalog.manifest import AudioInput, ImageInput, Manifest
from edge_agent.errors import EdgeAgentError, from_os_error
from edge_agent.heads.base import Result, SpeechSegment, decode_checked
from edge_agent.heads.registry import build_frame_head
from edge_agent.heads.vad import VadConfig, VadSegmenter, audio_windows
from edge_agent.pipelines.decode import IMAGE_TOO_LARGE, decode_image
from edge_agent.runtime.base import CompiledModel
from edge_agent.runtime.preprocess import input_geometry
from edge_agent.runtime.stateful import StatefulVad
from edge_agent.vision.mapping import to_frame

AUDIO_SUFFIXES = {".wav", ".wave"}


def read_image(path: Path) -> npt.NDArray[np.uint8]:
    """Read an image file as uint8 BGR, or say clearly why not."""
    _check_file(path)
    # Read here and decode the bytes, as a folder source does: cv2.imread segfaults on a
    # name that is not UTF-8, and accepts a truncated JPEG that imdecode rejects.
    try:
        data = np.fromfile(path, dtype=np.uint8)
    except OSError as exc:
        raise from_os_error(exc) from None
    frame, why = decode_image(data)
    if frame is None:
        fix = (
            "downscale it (e.g. `convert IN -resize 8000x8000 out.jpg`)"
            if why == IMAGE_TOO_LARGE
            else "re-copy or re-export it as JPEG, PNG, BMP, TIFF or WebP"
        )
        raise EdgeAgentError(f"cannot decode image {path}: {why}", fix, code="input.unreadable")
    return frame


def read_audio(path: Path, rate: int) -> npt.NDArray[np.float32]:
    """Read a WAV file as mono float32 at `rate`."""
    _check_file(path)
    try:
        wav = load_wav(path, rate)
    except WavError as exc:
        raise EdgeAgentError(
            f"cannot read {path}: {exc}",
            "convert it to PCM WAV with `sox IN -r 16000 -c 1 out.wav`",
            code="input.unreadable",
        ) from None
    except OSError as exc:
        raise from_os_error(exc) from None
    if wav.missing_s > 0:
        # A one-shot answer on part of a clip would pass for the whole clip's; the
        # run-pipeline WAV source fails the same way, after what there was.
        raise EdgeAgentError(
            f"WAV file {path} ends {wav.missing_s:.2f} s short of what its header declares, "
            f"after {len(wav.samples) / wav.rate:.2f} s: it is truncated",
            f"re-copy the file, or re-export what is left with `sox --ignore-length {path} "
            "fixed.wav`",
            code="source.failed",
        )
    return resample(to_mono(wav.samples), wav.rate, rate)


def _check_file(path: Path) -> None:
    if path.is_dir():
        raise EdgeAgentError(
            f"input {path} is a folder, not a file",
            "pass one image or WAV file; run-pipeline takes a folder source",
            code="input.invalid",
        )
    if not path.exists():
        raise EdgeAgentError(
            f"input file {path} does not exist", "check the path", code="input.not_found"
        )
    if not path.is_file():
        raise EdgeAgentError(
            f"input {path} is not a regular file (a device, pipe or socket)",
            "pass one image or WAV file saved on disk",
            code="input.invalid",
        )
    if path.stat().st_size == 0:
        raise EdgeAgentError(
            f"input file {path} is empty", "pass an image or WAV file", code="input.unreadable"
        )


def infer_frame(
    model: CompiledModel, manifest: Manifest, frame: npt.NDArray[np.uint8]
) -> list[Result]:
    """Run one uint8 BGR frame and decode it."""
    spec = manifest.input
    if manifest.task == "vad" or not isinstance(spec, ImageInput):
        raise EdgeAgentError(
            f"{manifest.name} takes audio, not an image",
            "pass a .wav file as --input",
            code="model.incompatible",
        )
    height, width = frame.shape[:2]
    geometry = input_geometry(spec.with_shape(model.report.model_shape), (width, height))
    outputs = model.infer({spec.name: geometry.prepare(frame)[None]})
    found = decode_checked(build_frame_head(manifest.head), outputs, geometry.model_size)
    return to_frame(found, geometry)


def infer_speech(
    model: CompiledModel, manifest: Manifest, samples: npt.NDArray[np.float32]
) -> list[SpeechSegment]:
    """Run a whole clip through a stateful VAD and return its speech segments."""
    head = manifest.head
    if manifest.task != "vad" or not isinstance(head, VadConfig):
        raise EdgeAgentError(
            f"{manifest.name} is not a VAD model",
            "pass an image as --input",
            code="model.incompatible",
        )
    segmenter = VadSegmenter(head)
    vad = StatefulVad(model, head)
    found: list[SpeechSegment] = []
    for window in audio_windows(samples, head.window, head.context):
        found.extend(segmenter.push(vad.step(window)))
    found.extend(segmenter.flush())
    return found


def read_input(manifest: Manifest, path: Path) -> npt.NDArray[np.generic]:
    """Read the file the model takes: a BGR frame, or mono samples at the model's rate.

    Called before compiling, so a bad input fails fast.
    """
    if manifest.task == "vad":
        if path.suffix.lower() not in AUDIO_SUFFIXES:
            raise EdgeAgentError(
                f"{manifest.name} takes audio; {path.name} is not a .wav file",
                "convert it with `sox IN -r 16000 -c 1 out.wav`",
                code="input.invalid",
            )
        return read_audio(path, _audio(manifest).sample_rate)
    if path.suffix.lower() in AUDIO_SUFFIXES:
        raise EdgeAgentError(
            f"{manifest.name} takes images, not audio", "pass an image file", code="input.invalid"
        )
    return read_image(path)


def _audio(manifest: Manifest) -> AudioInput:
    # The manifest's validator pairs the vad task with audio input; this keeps mypy told.
    spec = manifest.input
    if not isinstance(spec, AudioInput):
        raise EdgeAgentError(
            f"{manifest.name} is a vad model without audio input",
            "fix the manifest",
            code="config.invalid",
        )
    return spec


def infer_input(
    model: CompiledModel, manifest: Manifest, data: npt.NDArray[np.generic]
) -> list[Result]:
    """Infer on what `read_input` returned."""
    if manifest.task == "vad":
        return list(infer_speech(model, manifest, data.astype(np.float32, copy=False)))
    return infer_frame(model, manifest, data.astype(np.uint8, copy=False))
