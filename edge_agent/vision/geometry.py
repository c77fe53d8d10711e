"""How a frame, or a rectangle of it, becomes the model's input: crop, scale, pad.

One `Geometry` owns that transform for one model call, and maps boxes and keypoints
between the two pixel spaces. Heads decode in model-input pixels and know nothing of
frames; the pipeline hands their boxes to `Geometry.to_frame`.

Each axis is one affine map, `model = dst0 + (frame - src0) * scale`, from a source
rectangle of the frame (`source`, integer pixels) to a destination rectangle of the
model input (`target`, integer pixels); what `target` leaves uncovered is padding.
Coordinates are continuous, with pixel edges on integers (pixel i spans [i, i+1)), which
is also what cv2.resize assumes, so a box edge drawn on the frame lands where the map says.

The three fits, for a model input of W x H and a crop of w x h:
- stretch: the crop fills the input, each axis scaled on its own (the aspect changes);
- letterbox: one scale, min(W/w, H/h); the resized crop is centred and the rest padded
  with `pad_value` (Ultralytics trains and exports YOLO so, with 114);
- crop: one scale, max(W/w, H/h); the crop's centre part of the model's aspect is kept
  and its sides (or top and bottom) are not seen.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import cv2
import numpy as np
import numpy.typing as npt

from edge_agent.errors import EdgeAgentError

Fit = Literal["letterbox", "stretch", "crop"]
Rect = tuple[int, int, int, int]
"""x_min, y_min, x_max, y_max in integer pixels, max exclusive."""
Image = npt.NDArray[np.uint8]
Boxes = npt.NDArray[np.float64]


def clip_rect(rect: Rect, frame_size: tuple[int, int]) -> Rect:
    """`rect` cut to a frame of (width, height); an empty result keeps at least 1 px."""
    width, height = frame_size
    x0 = min(max(rect[0], 0), width - 1)
    y0 = min(max(rect[1], 0), height - 1)
    return (x0, y0, max(min(rect[2], width), x0 + 1), max(min(rect[3], height), y0 + 1))


@dataclass(frozen=True, slots=True)
class Geometry:
    """The transform of one frame rectangle into one model input.

    Build it with `Geometry.fit`; the fields are what the transform is, for logs and tests.
    """

    frame_size: tuple[int, int]
    """(width, height) of the whole frame."""
    model_size: tuple[int, int]
    """(width, height) of the model's input."""
    fit_mode: Fit
    """How the crop was fitted."""
    pad_value: int
    """Grey level of the padding (letterbox only)."""
    crop: Rect
    """The rectangle of the frame asked for, cut to the frame."""
    source: Rect
    """The rectangle of the frame actually seen (smaller than `crop` for fit "crop")."""
    target: Rect
    """Where `source` lands in the model input; the rest is padding."""
    antialias: bool = False
    """Shrink with cv2.INTER_AREA instead of INTER_LINEAR. AREA keeps thin edges that
    LINEAR's 2x2 sampling skips on a large shrink, but measured here it costs 3.7 ms for a
    whole 720p frame into 300x300 against 0.2 ms (0.9 vs 0.2 ms for a 360 px region), so
    it is opt-in; regions and tiles shrink by under 2x, where the two differ little."""

    @classmethod
    def fit(
        cls,
        frame_size: tuple[int, int],
        model_size: tuple[int, int],
        fit: Fit = "letterbox",
        pad_value: int = 114,
        crop: Rect | None = None,
        antialias: bool = False,
    ) -> Geometry:
        """The transform of `crop` (default: the whole frame) into a model input.

        Args:
            frame_size: (width, height) of the frame.
            model_size: (width, height) of the model's input.
            fit: "letterbox", "stretch" or "crop" (see the module's docstring).
            pad_value: 0-255, the padding's grey level for letterbox.
            crop: a rectangle of the frame in pixels; parts outside the frame are cut off
                first, so a square region at a frame edge stays aspect-true when letterboxed.
            antialias: shrink with INTER_AREA (see the field).

        Raises:
            EdgeAgentError: `input.invalid`, a size is not positive or `pad_value` is not 0-255.
        """
        if min(*frame_size, *model_size) < 1 or not 0 <= pad_value <= 255:
            raise EdgeAgentError(
                f"cannot fit a {frame_size} frame into a {model_size} input "
                f"with pad value {pad_value}",
                "sizes must be positive and the pad value 0-255",
                code="input.invalid",
            )
        box = clip_rect(crop or (0, 0, *frame_size), frame_size)
        mw, mh = model_size
        cw, ch = box[2] - box[0], box[3] - box[1]
        source, target = box, (0, 0, mw, mh)
        if fit == "letterbox":
            scale = min(mw / cw, mh / ch)
            tw, th = _side(cw * scale, mw), _side(ch * scale, mh)
            left, top = (mw - tw) // 2, (mh - th) // 2
            target = (left, top, left + tw, top + th)
        elif fit == "crop":
            scale = max(mw / cw, mh / ch)
            sw, sh = _side(mw / scale, cw), _side(mh / scale, ch)
            left, top = box[0] + (cw - sw) // 2, box[1] + (ch - sh) // 2
            source = (left, top, left + sw, top + sh)
        return cls(frame_size, model_size, fit, pad_value, box, source, target, antialias)

    @property
    def scale(self) -> tuple[float, float]:
        """Model pixels per frame pixel, (x, y); equal for letterbox and crop up to rounding."""
        s, t = self.source, self.target
        return (t[2] - t[0]) / (s[2] - s[0]), (t[3] - t[1]) / (s[3] - s[1])

    def to_frame(self, boxes: npt.ArrayLike, clip: bool = True) -> Boxes:
        """Boxes in model-input pixels ([N, 4] x_min, y_min, x_max, y_max) to frame pixels.

        Args:
            boxes: [N, 4] or [4].
            clip: cut the result to `source`, the part of the frame the model saw
                (a box reaching into letterbox padding ends at the picture's edge).

        Returns:
            [N, 4] float64.
        """
        out = self._map(_as_boxes(boxes), inverse=True)
        return self._clip(out) if clip else out

    def box_to_frame(
        self, box: tuple[float, float, float, float]
    ) -> tuple[float, float, float, float]:
        """One box in model-input pixels to frame pixels, clipped: `to_frame(box)[0]`.

        The same arithmetic in plain Python, for the pipeline's emitter, which maps each
        frame's few detections with its caches cold, where each numpy call costs several
        microseconds of dispatch: `mapping.to_frame` of one detection took 30 us through
        this against 132 us through the array path (person-ssdlite, 2 cores, thread CPU,
        medians).
        """
        s, t = self.source, self.target
        sx, sy = self.scale
        x_lo, y_lo, x_hi, y_hi = (float(v) for v in s)
        x0, y0, x1, y1 = box
        return (
            min(max(x_lo + (x0 - t[0]) / sx, x_lo), x_hi),
            min(max(y_lo + (y0 - t[1]) / sy, y_lo), y_hi),
            min(max(x_lo + (x1 - t[0]) / sx, x_lo), x_hi),
            min(max(y_lo + (y1 - t[1]) / sy, y_lo), y_hi),
        )

    def to_model(self, boxes: npt.ArrayLike) -> Boxes:
        """Boxes in frame pixels to model-input pixels ([N, 4] float64)."""
        return self._map(_as_boxes(boxes), inverse=False)

    def points_to_frame(self, points: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """Keypoints [..., 2] (x, y) in model-input pixels to frame pixels (not clipped)."""
        pts = np.asarray(points, dtype=np.float64)
        return self._map(pts.reshape(-1, 2), inverse=True).reshape(pts.shape)

    def points_to_model(self, points: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """Keypoints [..., 2] (x, y) in frame pixels to model-input pixels."""
        pts = np.asarray(points, dtype=np.float64)
        return self._map(pts.reshape(-1, 2), inverse=False).reshape(pts.shape)

    def new_input(self) -> Image:
        """A model-size H x W x 3 uint8 buffer for `prepare`; allocate once, reuse."""
        return np.empty((self.model_size[1], self.model_size[0], 3), dtype=np.uint8)

    def prepare(self, frame: Image, out: Image | None = None) -> Image:
        """Write the fitted `frame` into `out` (or a new buffer) and return it.

        Args:
            frame: the whole H x W x 3 uint8 frame, of `frame_size`.
            out: a buffer from `new_input` (any geometry of the same model size), reused
                across frames and regions so the hot path allocates nothing.

        Returns:
            `out`: model height x model width x 3, uint8, same channel order as `frame`.

        Raises:
            EdgeAgentError: `input.invalid`, the frame or buffer has the wrong shape.
        """
        width, height = self.frame_size
        mw, mh = self.model_size
        if frame.shape[:2] != (height, width) or frame.ndim != 3:
            raise EdgeAgentError(
                f"frame is {frame.shape}, the geometry was built for {width}x{height}x3",
                "build the geometry for the frame's size (a source changed resolution?)",
                code="input.invalid",
            )
        buffer = self.new_input() if out is None else out
        if buffer.shape != (mh, mw, 3) or buffer.dtype != np.uint8:
            raise EdgeAgentError(
                f"input buffer is {buffer.shape} {buffer.dtype}, the model takes {mh}x{mw}x3 uint8",
                "allocate it with Geometry.new_input()",
                code="input.invalid",
            )
        s, t = self.source, self.target
        if t != (0, 0, mw, mh):
            # Only the bands around the picture; the buffer may hold another region's pixels.
            buffer[: t[1]] = self.pad_value
            buffer[t[3] :] = self.pad_value
            buffer[t[1] : t[3], : t[0]] = self.pad_value
            buffer[t[1] : t[3], t[2] :] = self.pad_value
        picture = frame[s[1] : s[3], s[0] : s[2]]
        window = buffer[t[1] : t[3], t[0] : t[2]]
        if picture.shape == window.shape:
            window[...] = picture
        else:
            shrink = picture.shape[1] > window.shape[1]
            method = cv2.INTER_AREA if shrink and self.antialias else cv2.INTER_LINEAR
            cv2.resize(
                picture, (window.shape[1], window.shape[0]), dst=window, interpolation=method
            )
        return buffer

    def _map(self, values: npt.NDArray[np.float64], *, inverse: bool) -> npt.NDArray[np.float64]:
        s, t = self.source, self.target
        sx, sy = self.scale
        # Columns alternate x, y (boxes: x0 y0 x1 y1; points: x y).
        cols = values.shape[1]
        src0 = np.tile([s[0], s[1]], cols // 2).astype(np.float64)
        dst0 = np.tile([t[0], t[1]], cols // 2).astype(np.float64)
        scale = np.tile([sx, sy], cols // 2)
        out: npt.NDArray[np.float64] = (
            src0 + (values - dst0) / scale if inverse else dst0 + (values - src0) * scale
        )
        return out

    def _clip(self, boxes: Boxes) -> Boxes:
        s = self.source
        lo = np.array([s[0], s[1], s[0], s[1]], dtype=np.float64)
        hi = np.array([s[2], s[3], s[2], s[3]], dtype=np.float64)
        return np.clip(boxes, lo, hi)


def _side(value: float, limit: int) -> int:
    # Round to whole pixels, never 0 and never past the other rectangle.
    return min(max(round(value), 1), limit)


def _as_boxes(boxes: npt.ArrayLike) -> Boxes:
    return np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
