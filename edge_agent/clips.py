"""Test clips built from scikit-image's photos, with per-frame ground truth.

The astronaut walks into a 640x480 scene (the coffee photo) from the left, lingers in
the middle, and walks out to the right. `person-ssdlite` wants large people (see its
manifest notes), so she is pasted 480 px tall, the full frame height. The tests, the
benchmarks and the demo all build their video here, so each sees the same frames.

scikit-image is not a runtime dependency of edge-agent (it comes with the `test` extra);
it is imported only when a photo is first needed.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import numpy.typing as npt

from edge_agent.errors import EdgeAgentError

WIDTH, HEIGHT, FPS = 640, 480, 30.0
PERSON = 480

Image = npt.NDArray[np.uint8]


@dataclass(frozen=True)
class WalkVideo:
    """A written walk video and what is true of each of its frames."""

    path: Path
    frames: int
    fps: float
    visible: list[bool]
    """Per frame: the whole person is inside the frame."""
    absent: list[bool]
    """Per frame: no part of the person is inside the frame."""


def sample(name: str) -> Image:
    """A scikit-image sample photo by name (RGB, or grey for `page`), as uint8.

    Raises:
        EdgeAgentError: `install.incomplete`, scikit-image is not installed.
    """
    try:
        import skimage.data
    except ImportError:
        raise EdgeAgentError(
            "the sample photos come from scikit-image, which is not installed",
            "pip install scikit-image (or edge-agent's `test` extra)",
            code="install.incomplete",
        ) from None
    return np.asarray(getattr(skimage.data, name)(), dtype=np.uint8)


def bgr(rgb: Image) -> Image:
    """skimage gives RGB; cameras and cv2 give BGR."""
    return np.ascontiguousarray(rgb[:, :, ::-1])


@functools.cache
def _background() -> Image:
    scene = cv2.resize(bgr(sample("coffee")), (WIDTH, HEIGHT), interpolation=cv2.INTER_AREA)
    return np.asarray(scene, dtype=np.uint8)


@functools.cache
def _person() -> Image:
    image = cv2.resize(bgr(sample("astronaut")), (PERSON, PERSON), interpolation=cv2.INTER_AREA)
    return np.asarray(image, dtype=np.uint8)


def compose(x: int) -> Image:
    """The scene with the person's left edge at `x` (may be partly or wholly outside)."""
    frame = _background().copy()
    figure = _person()
    top = HEIGHT - PERSON
    left, right = max(x, 0), min(x + PERSON, WIDTH)
    if right > left:
        frame[top:, left:right] = figure[:, left - x : right - x]
    return frame


def walk_positions(empty: int, crossing: int) -> list[int]:
    """Left edge per frame: `empty` frames with nobody, a crossing, then `empty` again."""
    start, end = -PERSON - 10, WIDTH + 10
    path: list[int] = [int(x) for x in np.linspace(start, end, crossing).round()]
    hold = int(WIDTH - PERSON) // 2
    # Linger in the middle a while, so a person is really seen, not only glimpsed.
    middle = crossing // 2
    path = path[:middle] + [hold] * crossing + path[middle:]
    return [start] * empty + path + [end] * empty


def write_walk(
    path: Path, empty: int = 45, crossing: int = 40, frames: int | None = None
) -> WalkVideo:
    """Write the walk as MJPG at 30 fps.

    Args:
        path: the video file to write (.avi).
        empty: frames with nobody before and after the crossing.
        crossing: frames of the crossing (and as many again lingering in the middle).
        frames: length of the video; the walk repeats to fill it. Default: one walk.

    Raises:
        EdgeAgentError: `path.unwritable`, OpenCV cannot write MJPG video at `path`.
    """
    walk = walk_positions(empty, crossing)
    positions = [walk[i % len(walk)] for i in range(len(walk) if frames is None else frames)]
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"MJPG"), FPS, (WIDTH, HEIGHT))
    if not writer.isOpened():
        raise EdgeAgentError(
            f"OpenCV cannot write MJPG video to {path}",
            "check the folder exists and is writable, and that OpenCV has its video codecs",
            code="path.unwritable",
        )
    last: tuple[int, Image] | None = None
    try:
        for x in positions:
            # The empty stretches and the linger repeat one frame; compose it once.
            if last is None or last[0] != x:
                last = (x, compose(x))
            writer.write(last[1])
    finally:
        writer.release()
    return WalkVideo(
        path=path,
        frames=len(positions),
        fps=FPS,
        visible=[x >= 0 and x + PERSON <= WIDTH for x in positions],
        absent=[x + PERSON <= 0 or x >= WIDTH for x in positions],
    )
