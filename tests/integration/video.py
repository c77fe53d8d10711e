"""Test videos built from scikit-image photos, with per-frame ground truth.

The astronaut walks into a 640x480 scene from the left, crosses it and walks
out to the right. `person-ssdlite` wants large people (see its manifest
notes), so she is pasted 480 px tall (the full frame height).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import numpy.typing as npt

from tests.conftest import bgr, sample

WIDTH, HEIGHT, FPS = 640, 480, 30.0
PERSON = 480


@dataclass(frozen=True)
class WalkVideo:
    path: Path
    frames: int
    fps: float
    visible: list[bool]
    """Per frame: the whole person is inside the frame."""
    absent: list[bool]
    """Per frame: no part of the person is inside the frame."""


def background() -> npt.NDArray[np.uint8]:
    scene = cv2.resize(bgr(sample("coffee")), (WIDTH, HEIGHT), interpolation=cv2.INTER_AREA)
    return np.asarray(scene, dtype=np.uint8)


def person() -> npt.NDArray[np.uint8]:
    image = cv2.resize(bgr(sample("astronaut")), (PERSON, PERSON), interpolation=cv2.INTER_AREA)
    return np.asarray(image, dtype=np.uint8)


def compose(x: int) -> npt.NDArray[np.uint8]:
    """The scene with the person's left edge at `x` (may be partly or wholly outside)."""
    frame = background().copy()
    figure = person()
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


def write_walk(path: Path, empty: int = 45, crossing: int = 40) -> WalkVideo:
    positions = walk_positions(empty, crossing)
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"MJPG"), FPS, (WIDTH, HEIGHT))
    assert writer.isOpened(), "OpenCV cannot write MJPG video here"
    for x in positions:
        writer.write(compose(x))
    writer.release()
    return WalkVideo(
        path=path,
        frames=len(positions),
        fps=FPS,
        visible=[x >= 0 and x + PERSON <= WIDTH for x in positions],
        absent=[x + PERSON <= 0 or x >= WIDTH for x in positions],
    )
