"""Image preprocessing as the manifest describes it.

OpenVINO folds these same steps into the graph (see openvino_backend); this
numpy version serves ONNX Runtime and is the reference the two are tested
against. Only the centre crop runs on the host for both, since its offsets
depend on the frame size: it is a slice (a view), so it costs nothing.
"""

from __future__ import annotations

import cv2
import numpy as np
import numpy.typing as npt

from edge_agent.catalog.manifest import ImageInput

Frame = npt.NDArray[np.uint8]


def center_crop(frame: Frame, fraction: float) -> Frame:
    """Keep a centred square of `fraction` times the short side (a view, not a copy)."""
    if fraction >= 1.0:
        return frame
    height, width = frame.shape[:2]
    side = max(1, round(min(height, width) * fraction))
    top, left = (height - side) // 2, (width - side) // 2
    return frame[top : top + side, left : left + side]


def frame_tensor(frame: Frame, spec: ImageInput) -> npt.NDArray[np.generic]:
    """Turn a uint8 BGR HWC frame into the model's input tensor, batch of one."""
    image = cv2.resize(
        center_crop(frame, spec.center_crop),
        (spec.width, spec.height),
        interpolation=cv2.INTER_LINEAR,
    )
    if spec.color == "RGB":
        image = image[:, :, ::-1]
    if spec.element_type == "u8":
        tensor: npt.NDArray[np.generic] = np.ascontiguousarray(image)
    else:
        mean = np.asarray(spec.mean, dtype=np.float32)
        scale = np.asarray(spec.scale, dtype=np.float32)
        tensor = (image.astype(np.float32) - mean) / scale
    if spec.layout == "NCHW":
        tensor = tensor.transpose(2, 0, 1)
    return np.ascontiguousarray(tensor[None])
