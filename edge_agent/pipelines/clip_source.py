"""A `FrameSource` over a rendered `vision.clips.Clip`: camera-shaped frames with truth boxes.

For the detection-mode tests and `tools/bench_detect.py`: frames are rendered as they are
read (no video file, no codec), so a figure measures the pipeline, not a decoder.
"""

from __future__ import annotations

import time

from edge_agent.pipelines.base import Frame
from edge_agent.vision.clips import Clip


class ClipSource:
    """Reads `clip`'s frames in order, stamped with their stream time (index / fps).

    Args:
        clip: the clip.
        start: first frame index.
        stop: one past the last frame index (default: the clip's end).
        step: read every `step`th frame (a sample, for modes that keep no state).
    """

    def __init__(self, clip: Clip, start: int = 0, stop: int | None = None, step: int = 1) -> None:
        self.clip = clip
        self._next = start
        self._stop = clip.frames if stop is None else min(stop, clip.frames)
        self._step = max(1, step)

    def read(self) -> Frame | None:
        if self._next >= self._stop:
            return None
        t0 = time.perf_counter()
        index = self._next
        self._next += self._step
        image = self.clip.frame(index)
        return Frame(index, index / self.clip.fps, image, time.perf_counter() - t0)

    @property
    def dropped(self) -> int:
        return 0

    def close(self) -> None:
        self._next = self._stop
