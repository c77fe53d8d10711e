"""A cheap motion detector: where did this frame change against a running background?

Everything runs on a grey copy about 160 px wide: at 1280x720 that is 8x fewer pixels
per side, so the whole step costs well under a millisecond after the resize, against a
model call of several. The steps are Frigate's: blur away sensor noise, compare with a
running average of past frames (cv2.accumulateWeighted), threshold, dilate so the parts
of one mover join, and take the bounding boxes of the contours.

A change over most of the picture (lights on, the sun behind a cloud, the camera's
auto-exposure) is not motion: the background is re-learned from that frame and the frame
reports none. Masked pixels are zeroed before the contours, so they never move.
"""

from __future__ import annotations

import cv2
import numpy as np
import numpy.typing as npt

from edge_agent.errors import EdgeAgentError
from edge_agent.vision.geometry import Rect

Image = npt.NDArray[np.uint8]


class MotionDetector:
    """Motion boxes of a stream's frames, in frame pixels. Not thread-safe: one per stream.

    Args:
        frame_size: (width, height) of the frames.
        width: the working width; the height follows the frame's aspect.
        threshold: grey levels (0-255) a pixel must differ from the background by.
        alpha: weight of each new frame in the running background. Lower learns slower:
            a walker drags a longer ghost trail (at 0.05 and 15 fps, a box 2-3 times the
            person's width, so a region too big to see them well); higher forgets a person
            who stops within a second, which the tracked regions cover.
        min_area: a moving patch smaller than this fraction of the working frame is noise.
        lighting: above this fraction of changed pixels, the change is the light.
        mask: (working height, working width) uint8, 0 where motion is ignored
            (`Scene.motion_mask(detector.size)`), or None.
    """

    def __init__(
        self,
        frame_size: tuple[int, int],
        width: int = 160,
        threshold: int = 25,
        alpha: float = 0.2,
        min_area: float = 0.0005,
        lighting: float = 0.5,
        mask: Image | None = None,
    ) -> None:
        self.frame_size = frame_size
        w = min(width, frame_size[0])
        self.size = (w, max(1, round(frame_size[1] * w / frame_size[0])))
        self.threshold = threshold
        self.alpha = alpha
        self.min_pixels = max(1.0, min_area * self.size[0] * self.size[1])
        self.lighting = lighting
        self.mask = mask
        if mask is not None and mask.shape != (self.size[1], self.size[0]):
            raise EdgeAgentError(
                f"motion mask is {mask.shape}, the detector works at {self.size[::-1]}",
                "build it with Scene.motion_mask(detector.size)",
                code="input.invalid",
            )
        self._background: npt.NDArray[np.float32] | None = None
        self._kernel = cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (5, 5))
        self.relearned = 0
        """Frames whose change was taken for a lighting change."""

    def reset(self) -> None:
        """Forget the background (a source reopened, the camera moved)."""
        self._background = None

    def detect(self, frame: Image) -> list[Rect]:
        """Feed one BGR (or grey) frame; return the moving boxes, in frame pixels.

        The first frame, and any frame taken for a lighting change, only (re)learn the
        background and return no boxes.
        """
        small = cv2.resize(frame, self.size, interpolation=cv2.INTER_AREA)
        grey = cv2.cvtColor(small, cv2.COLOR_BGR2GRAY) if small.ndim == 3 else small
        grey = cv2.GaussianBlur(grey, (5, 5), 0)
        if self._background is None:
            self._background = grey.astype(np.float32)
            return []
        diff = cv2.absdiff(grey, cv2.convertScaleAbs(self._background))
        _, moving = cv2.threshold(diff, self.threshold, 255, cv2.THRESH_BINARY)
        if self.mask is not None:
            moving = cv2.bitwise_and(moving, self.mask)
        cv2.accumulateWeighted(grey, self._background, self.alpha)
        if cv2.countNonZero(moving) > self.lighting * moving.size:
            self._background = grey.astype(np.float32)
            self.relearned += 1
            return []
        moving = cv2.dilate(moving, self._kernel, iterations=2)
        contours, _ = cv2.findContours(moving, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
        sx = self.frame_size[0] / self.size[0]
        sy = self.frame_size[1] / self.size[1]
        boxes: list[Rect] = []
        for contour in contours:
            if cv2.contourArea(contour) < self.min_pixels:
                continue
            x, y, w, h = cv2.boundingRect(contour)
            boxes.append(
                (
                    int(x * sx),
                    int(y * sy),
                    min(self.frame_size[0], int(np.ceil((x + w) * sx))),
                    min(self.frame_size[1], int(np.ceil((y + h) * sy))),
                )
            )
        return boxes
