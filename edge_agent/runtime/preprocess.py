"""Image preprocessing as the manifest describes it.

Geometry runs on the host for both engines, as one `vision.geometry.Geometry`
(crop, scale, pad; the manifest's `fit` and `pad_value`), skipped when the frame
is already the model's size. Measured on this project's reference models,
OpenVINO's in-graph Interpolate cost 1.5-2.4 ms per inference even when it
changed nothing, against about 0.2 ms for cv2 on a 640x480 frame; for a 720p
frame into person-ssdlite, PrePostProcessor resize (and pad, which it does only
on float tensors) made each call 1.1-1.7 ms slower than the host's 0.4 ms fit
(tools/bench_detect.py), and one graph cannot crop the tiles and regions. Colour
order, element type, normalisation and layout are folded into the OpenVINO
graph (see openvino_backend), where they fuse into the first layer; a uint8
model's RGB order is the exception, swapped on the host, as the graph has no
layer to fuse it into (`openvino_backend.host_swaps_colour`). This numpy
version of them serves ONNX Runtime and is the reference the two are tested
against.

On a small model the host's share is large, so each channel is written once,
straight into the output tensor, instead of building four intermediate
full-size arrays (astype, minus, divide, transpose). A uint8 pixel has 256
values, so for float NCHW (every ONNX reference model) (x - mean) / scale is a
per-channel 256-entry table, computed with the same float32 operations as the
numpy path (identical bits), and cv2.LUT applies it, releasing the GIL while the
engine's other runs need it. Measured per frame: text-det-ppocr (640x640) 0.31
ms against 0.57 ms for numpy's subtract and divide; text-orientation (224x224,
with its centre crop and resize) 0.12 against 0.14 ms. Batches arrive as N
frames and leave as one N-batch tensor.
"""

from __future__ import annotations

from functools import lru_cache

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

    A frame already at the model's size (and not centre-cropped) is returned as it is.
    """
    if frame.shape[0] == spec.height and frame.shape[1] == spec.width and spec.center_crop >= 1:
        return np.ascontiguousarray(frame)
    height, width = frame.shape[:2]
    return input_geometry(spec, (width, height)).prepare(np.ascontiguousarray(frame))


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


def frame_tensor(frame: Frame, spec: ImageInput) -> npt.NDArray[np.generic]:
    """Turn a uint8 BGR HWC frame into the model's input tensor, batch of one."""
    return _tensor(frame[None], spec)


def frames_tensor(batch: npt.NDArray[np.generic], spec: ImageInput) -> npt.NDArray[np.generic]:
    """Turn N uint8 BGR HWC frames into the model's N-batch input tensor.

    Raises:
        EdgeAgentError: the number of frames is not the model's batch size.
    """
    frames = batch.astype(np.uint8, copy=False)
    _check_batch(frames, spec)
    return _tensor(frames, spec)


def _tensor(frames: Frame, spec: ImageInput) -> npt.NDArray[np.generic]:
    count = frames.shape[0]
    nchw = spec.layout == "NCHW"
    dims = (count, 3, spec.height, spec.width) if nchw else (count, spec.height, spec.width, 3)
    dtype = np.uint8 if spec.element_type == "u8" else np.float32
    out = np.empty(dims, dtype=dtype)
    # Output channel c reads source channel `order[c]` of the BGR frame.
    order = (2, 1, 0) if spec.color == "RGB" else (0, 1, 2)
    tables = _tables(tuple(spec.mean), tuple(spec.scale)) if nchw and dtype != np.uint8 else None
    for i in range(count):
        image = fit_frame(frames[i], spec)
        if tables is not None:
            planes = cv2.split(image)
            for c, src in enumerate(order):
                cv2.LUT(planes[src], tables[c], dst=out[i, c])
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


@lru_cache(maxsize=32)
def _tables(
    mean: tuple[float, ...], scale: tuple[float, ...]
) -> tuple[npt.NDArray[np.float32], ...]:
    # The numpy path's own float32 operations on every uint8 value, so both give the same bits.
    values = np.arange(256, dtype=np.float32)
    tables = []
    for m, s in zip(mean, scale, strict=True):
        table = np.subtract(values, np.float32(m), dtype=np.float32)
        if s != 1.0:
            table = np.divide(table, np.float32(s))
        tables.append(table)
    return tuple(tables)


def _check_batch(frames: Frame, spec: ImageInput) -> None:
    if frames.ndim != 4 or frames.shape[0] != spec.shape[0]:
        got = frames.shape[0] if frames.ndim == 4 else "a non-NHWC array of"
        raise EdgeAgentError(
            f"fed {got} frames to a model compiled for batch {spec.shape[0]}",
            f"pass {spec.shape[0]} uint8 BGR frames stacked as N,H,W,3, "
            "or compile with a --shape whose batch matches",
            code="model.shape",
        )
