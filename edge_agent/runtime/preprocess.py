"""Image preprocessing as the manifest describes it.

Geometry runs on the host for both engines, as one `vision.geometry.Geometry` (crop,
scale, pad; the manifest's `fit`, `pad_value` and `center_crop`), skipped when the
frame is already the model's size: such a frame IS the model's input, fitted by its
caller (`infer`, the pipelines), and is never centre-cropped again. Measured on this
project's reference models, OpenVINO's in-graph Interpolate cost 1.5-2.4 ms per
inference even when it changed nothing, against about 0.2 ms for cv2 on a 640x480
frame; for a 720p frame into person-ssdlite, PrePostProcessor resize (and pad, which
it does only on float tensors) made each call 1.1-1.7 ms slower than the host's 0.4
ms fit (tools/bench_detect.py), and one graph cannot crop the tiles and regions.
Colour order, element type, normalisation and layout are folded into the OpenVINO
graph (see openvino_backend), where they fuse into the first layer; a uint8 model's
RGB order is the exception, swapped on the host, as the graph has no layer to fuse
it into (`openvino_backend.host_swaps_colour`). This numpy version of them serves
ONNX Runtime and is the reference the two are tested against.

On a small model the host's share is large, so each channel is written once,
straight into the output tensor, instead of building four intermediate
full-size arrays (astype, minus, divide, transpose). For float NCHW (every ONNX
reference model) each plane goes through one cv2.addWeighted, x * (1 / scale) -
mean / scale to float32 in a single vectorised pass that releases the GIL while
the engine's other runs need it; it differs from numpy's (x - mean) / scale by
an ulp or two (the reciprocal is rounded once more). Measured per frame, one
thread: text-orientation (a 256x256 frame, centre-cropped to 224) 32 us against
55 us for a per-channel 256-entry table through cv2.LUT, and about 90 us for
numpy; text-det-ppocr (640x640) 0.23 ms against 0.37 ms for the table. Batches
arrive as N frames and leave as one N-batch tensor.
"""

from __future__ import annotations

import cv2
import numpy as np
import numpy.typing as npt

from edge_agent.catalog.manifest import ImageInput
from edge_agent.errors import EdgeAgentError
from edge_agent.vision.geometry import Geometry, Rect

Frame = npt.NDArray[np.uint8]


def _centre_square(frame_size: tuple[int, int], fraction: float) -> Rect:
    width, height = frame_size
    side = max(1, round(min(width, height) * fraction))
    left, top = (width - side) // 2, (height - side) // 2
    return (left, top, left + side, top + side)


def center_crop(frame: Frame, fraction: float) -> Frame:
    """Keep a centred square of `fraction` times the short side (a view, not a copy)."""
    if fraction >= 1.0:
        return frame
    x0, y0, x1, y1 = _centre_square((frame.shape[1], frame.shape[0]), fraction)
    return frame[y0:y1, x0:x1]


def input_geometry(
    spec: ImageInput, frame_size: tuple[int, int], crop: Rect | None = None
) -> Geometry:
    """How a frame of `frame_size` (or its rectangle `crop`) becomes this model's input.

    The manifest's `fit` and `pad_value` decide; `center_crop` (classifiers) narrows the
    whole frame to its centred square first. The pipeline caches the result per frame
    size, and maps every head's results back through it.
    """
    if crop is None and spec.center_crop < 1.0:
        crop = _centre_square(frame_size, spec.center_crop)
    return Geometry.fit(frame_size, (spec.width, spec.height), spec.fit, spec.pad_value, crop=crop)


def fit_frame(frame: Frame, spec: ImageInput) -> Frame:
    """Fit a uint8 BGR HWC frame to the model's input as `input_geometry` says.

    A frame already at the model's size is the model's input and is returned as it is,
    even for a centre-cropped model: every caller with a whole frame fits it (crop, then
    resize) through `input_geometry` first, and cropping the fitted frame again made
    text-orientation see 0.875 squared of the short side, not the 0.875 it was trained on.
    Only a frame of another size is fitted here, once.
    """
    if _at_model_size(frame, spec):
        return np.ascontiguousarray(frame)
    return fit_whole_frame(frame, spec)


def fit_whole_frame(frame: Frame, spec: ImageInput) -> Frame:
    """Fit a whole camera frame or photo, of any size (the model's own included), as the
    pipelines and `infer` do: `center_crop`, then the manifest's fit. Calibration's data is
    such frames: `fit_frame` would take a 224x224 photo for an already fitted input and
    skip text-orientation's crop, gating a model on what it never serves."""
    height, width = frame.shape[:2]
    return input_geometry(spec, (width, height)).prepare(np.ascontiguousarray(frame))


def _at_model_size(frame: Frame, spec: ImageInput) -> bool:
    """Whether `frame` is the model's input as it is: at its size (whatever `center_crop`)."""
    return frame.shape[:2] == (spec.height, spec.width)


def fit_frames(batch: npt.NDArray[np.generic], spec: ImageInput) -> Frame:
    """`fit_frame` for each frame of an N-HWC uint8 batch; N must be the model's batch.

    Raises:
        EdgeAgentError: the number of frames is not the model's batch size.
    """
    frames = batch.astype(np.uint8, copy=False)
    _check_batch(frames, spec)
    if frames.shape[0] == 1:
        return fit_frame(frames[0], spec)[None]
    return np.stack([fit_frame(f, spec) for f in frames])


def fit_frames_into(
    batch: npt.NDArray[np.generic], spec: ImageInput, out: Frame, to_rgb: bool = False
) -> None:
    """`fit_frames`, written straight into `out` (N x H x W x 3 uint8: an engine's own input
    buffer), with BGR swapped to RGB on the way when `to_rgb`.

    One pass writes each frame where the engine reads it: no fitted copy to hand over, and
    the engine's input stays the buffer it already knows (see openvino_backend).

    Raises:
        EdgeAgentError: the number of frames is not the model's batch size, or the frames
            are not 3-channel.
    """
    frames = batch.astype(np.uint8, copy=False)
    _check_batch(frames, spec)
    if frames.shape[3] != 3:
        raise EdgeAgentError(
            f"frames are {frames.shape[1:]}, not height x width x 3",
            "pass uint8 BGR frames stacked as N,H,W,3",
            code="model.shape",
        )
    # All frames of a batch have one size, so whether they are at the model's size already
    # (the pipeline's reader fits them) is asked once; and each frame is taken by index,
    # not by iterating the arrays. This runs on the model's worker once a frame, with its
    # caches cold (the engine ran on its core meanwhile): the per-frame check and `zip`
    # over the two arrays cost 10 us there (78-80 against 89-90 us a call with the copy,
    # person-ssdlite, 2 cores, thread CPU, medians with the two alternating frame by frame).
    at_size = _at_model_size(frames[0], spec)
    for i in range(frames.shape[0]):
        frame, dst = frames[i], out[i]
        if at_size:
            fitted = frame
        else:
            height, width = frame.shape[:2]
            geometry = input_geometry(spec, (width, height))
            fitted = geometry.prepare(np.ascontiguousarray(frame), None if to_rgb else dst)
        if to_rgb:
            cv2.cvtColor(fitted, cv2.COLOR_BGR2RGB, dst=dst)
        elif fitted is not dst:
            np.copyto(dst, fitted)


def frame_tensor(frame: Frame, spec: ImageInput) -> npt.NDArray[np.generic]:
    """Turn a uint8 BGR HWC frame into the model's input tensor, batch of one."""
    return _tensor(frame[None], spec)


def frames_tensor(
    batch: npt.NDArray[np.generic],
    spec: ImageInput,
    reuse: npt.NDArray[np.generic] | None = None,
) -> npt.NDArray[np.generic]:
    """Turn N uint8 BGR HWC frames into the model's N-batch input tensor.

    Args:
        reuse: a tensor from an earlier call, written over when its shape and type fit.
            An engine that has finished with its input can hand it back: writing into
            memory still in the core's cache beats a fresh buffer (text-orientation on
            ONNX Runtime, 2 threads: about 1% of throughput).

    Raises:
        EdgeAgentError: the number of frames is not the model's batch size.
    """
    frames = batch.astype(np.uint8, copy=False)
    _check_batch(frames, spec)
    return _tensor(frames, spec, reuse)


def _tensor(
    frames: Frame, spec: ImageInput, reuse: npt.NDArray[np.generic] | None = None
) -> npt.NDArray[np.generic]:
    count = frames.shape[0]
    nchw = spec.layout == "NCHW"
    dims = (count, 3, spec.height, spec.width) if nchw else (count, spec.height, spec.width, 3)
    dtype = np.uint8 if spec.element_type == "u8" else np.float32
    fits = reuse is not None and reuse.shape == dims and reuse.dtype == dtype
    out = reuse if fits and reuse is not None else np.empty(dims, dtype=dtype)
    # Output channel c reads source channel `order[c]` of the BGR frame.
    order = (2, 1, 0) if spec.color == "RGB" else (0, 1, 2)
    affine = nchw and dtype != np.uint8
    for i in range(count):
        image = fit_frame(frames[i], spec)
        if affine:
            planes = cv2.split(image)
            for c, src in enumerate(order):
                plane, scale = planes[src], float(spec.scale[c])
                # src2 is weighted 0: addWeighted is the one cv2 call that converts and
                # scales in a single pass (convertTo is not in the Python API).
                cv2.addWeighted(
                    plane,
                    1.0 / scale,
                    plane,
                    0.0,
                    -float(spec.mean[c]) / scale,
                    dst=out[i, c],
                    dtype=cv2.CV_32F,
                )
            continue
        for c, src in enumerate(order):
            dst = out[i, c] if nchw else out[i, :, :, c]
            if dtype == np.uint8:
                dst[...] = image[:, :, src]
                continue
            np.subtract(image[:, :, src], np.float32(spec.mean[c]), out=dst, dtype=np.float32)
            if spec.scale[c] != 1.0:
                np.divide(dst, np.float32(spec.scale[c]), out=dst)
    return out


def _check_batch(frames: Frame, spec: ImageInput) -> None:
    if frames.ndim != 4 or frames.shape[0] != spec.shape[0]:
        got = frames.shape[0] if frames.ndim == 4 else "a non-NHWC array of"
        raise EdgeAgentError(
            f"fed {got} frames to a model compiled for batch {spec.shape[0]}",
            f"pass {spec.shape[0]} uint8 BGR frames stacked as N,H,W,3, "
            "or compile with a --shape whose batch matches",
            code="model.shape",
        )
