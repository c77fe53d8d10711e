"""Camera-shaped test clips: 16:9 scenes with people walking across, and their truth boxes.

The scene is a scikit-image photo widened to 1280x720 or 1920x1080 (the photo and its
mirror image side by side, so there is no seam); a person is the astronaut cropped to her
figure. People walk in from one side, may stop a while, and leave by the other, at a
walking pace for their size. Frames are rendered on demand (a 1080p clip held whole would
be gigabytes) and are the same on every run for a seed: seeded sensor noise, no clock.

scikit-image comes with the `test` extra; it is imported only when a photo is first needed.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import cv2
import numpy as np
import numpy.typing as npt

from edge_agent.clips import bgr, sample
from edge_agent.errors import EdgeAgentError
from edge_agent.vision.geometry import Rect

Image = npt.NDArray[np.uint8]

FIGURE = (16, 8, 384, 512)
"""The astronaut herself within the 512x512 photo (x0, y0, x1, y1): head to waist."""
PACE = 0.75
"""Walking speed in person-heights per second (1.3 m/s for someone 1.7 m tall)."""


@dataclass(frozen=True, slots=True)
class Walker:
    """One person's walk across the scene."""

    height: int
    """Height on screen in pixels."""
    feet: int
    """Frame row of the bottom of the figure."""
    enter_s: float
    """Stream time the figure starts to come in."""
    direction: int = 1
    """1: left to right; -1: right to left."""
    stop_at: float | None = None
    """Fraction of the frame width where the figure's centre stops, or None."""
    stop_s: float = 0.0
    """How long the stop lasts."""

    @property
    def width(self) -> int:
        return max(1, round(self.height * (FIGURE[2] - FIGURE[0]) / (FIGURE[3] - FIGURE[1])))

    def left(self, t: float, frame_width: int) -> float | None:
        """The figure's left edge at time `t`, or None when it is wholly outside."""
        speed = PACE * self.height
        travel = frame_width + self.width
        moved = (t - self.enter_s) * speed
        if self.stop_at is not None:
            stop = self.stop_at * frame_width + self.width / 2
            if self.direction < 0:
                stop = travel - stop
            if moved > stop:
                moved = max(stop, moved - self.stop_s * speed)
        if moved <= 0 or moved >= travel:
            return None
        return moved - self.width if self.direction > 0 else frame_width - moved

    def leaves_s(self, frame_width: int) -> float:
        """Stream time the figure is wholly gone again."""
        return self.enter_s + (frame_width + self.width) / (PACE * self.height) + self.stop_s


@dataclass(frozen=True, slots=True)
class Truth:
    """A person in one frame."""

    box: Rect
    """The visible part of the figure, in frame pixels."""
    height: int
    """The figure's full height on screen."""
    visible: float
    """Fraction of the figure inside the frame."""


@dataclass(frozen=True)
class Clip:
    """A rendered-on-demand clip: `frame(i)` and `truth[i]` for i in range(frames)."""

    size: tuple[int, int]
    fps: float
    frames: int
    walkers: tuple[Walker, ...]
    scene: str = "coffee"
    noise: float = 2.0
    lighting: tuple[tuple[float, float], ...] = ()
    """(from time s, gain): the whole picture's brightness changes at those times."""
    seed: int = 0
    truth: list[list[Truth]] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "truth", [self._truth(i / self.fps) for i in range(self.frames)])

    def _truth(self, t: float) -> list[Truth]:
        width, height = self.size
        found: list[Truth] = []
        for w in self.walkers:
            left = w.left(t, width)
            if left is None:
                continue
            x0, top = round(left), w.feet - w.height
            box = (max(x0, 0), max(top, 0), min(x0 + w.width, width), min(w.feet, height))
            if box[2] <= box[0] or box[3] <= box[1]:
                continue
            seen = (box[2] - box[0]) * (box[3] - box[1]) / (w.width * w.height)
            found.append(Truth(box, w.height, seen))
        return found

    def frame(self, index: int) -> Image:
        """Frame `index` as BGR uint8, height x width x 3."""
        width = self.size[0]
        t = index / self.fps
        image = _scene(self.scene, self.size).copy()
        for w in self.walkers:
            left = w.left(t, width)
            if left is None:
                continue
            _paste(image, _figure(w.height), round(left), w.feet - w.height)
        gain = next((g for start, g in reversed(self.lighting) if t >= start), 1.0)
        if gain != 1.0:
            cv2.convertScaleAbs(image, dst=image, alpha=gain)
        if self.noise > 0:
            up, down = _noise(self.size, self.noise, self.seed, index % _NOISE_FRAMES)
            cv2.add(image, up, dst=image)
            cv2.subtract(image, down, dst=image)
        return image

    def __iter__(self) -> Iterator[Image]:
        return (self.frame(i) for i in range(self.frames))


def walk_clip(
    size: tuple[int, int] = (1280, 720),
    seed: int = 0,
    walkers: Sequence[Walker] | None = None,
    fps: float = 15.0,
    tail_s: float = 2.0,
    scene: str = "coffee",
    noise: float = 2.0,
    lighting: Sequence[tuple[float, float]] = (),
) -> Clip:
    """A clip of `walkers`, or of the standard script for `seed`.

    The standard script: 2 s of empty scene; a person 180-300 px tall (at 720p; scaled
    with the frame height) walks in from the left, stops near the middle for 3 s and
    walks out; a second, 180-300 px, walks from right to left without stopping, entering
    as the first leaves; `tail_s` of empty scene.

    Args:
        size: (width, height); 1280x720 or 1920x1080 are the cameras this models.
        seed: picks sizes, feet rows and the stop, and the sensor noise.
        walkers: the walks, instead of the standard script.
        fps: frames per second.
        tail_s: empty seconds after the last person left.
        scene: the scikit-image photo behind them ("coffee", "rocket", ...).
        noise: standard deviation of the sensor noise, in grey levels.
        lighting: (from time s, gain) steps of the whole picture's brightness.
    """
    if walkers is None:
        rng = np.random.default_rng(seed)
        scale = size[1] / 720
        heights = [round(float(h) * scale) for h in rng.uniform(180, 300, 2)]
        feet = [round(float(f) * size[1]) for f in rng.uniform(0.7, 0.97, 2)]
        first = Walker(heights[0], feet[0], 2.0, 1, float(rng.uniform(0.35, 0.65)), 3.0)
        second = Walker(heights[1], feet[1], first.leaves_s(size[0]) - 1.0, -1)
        walkers = (first, second)
    end = max((w.leaves_s(size[0]) for w in walkers), default=0.0) + tail_s
    frames = round(end * fps)
    return Clip(size, fps, frames, tuple(walkers), scene, noise, tuple(lighting), seed)


def write_clip(clip: Clip, path: Path) -> Path:
    """Write `clip` as MJPG .avi at `path` and its truth as JSON beside it.

    Returns:
        The JSON file: size, fps, frames, walkers and per-frame truth boxes.

    Raises:
        EdgeAgentError: `path.unwritable`, OpenCV cannot write MJPG video at `path`.
    """
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"MJPG"), clip.fps, clip.size)
    if not writer.isOpened():
        raise EdgeAgentError(
            f"OpenCV cannot write MJPG video to {path}",
            "check the folder exists and is writable, and that OpenCV has its video codecs",
            code="path.unwritable",
        )
    try:
        for image in clip:
            writer.write(image)
    finally:
        writer.release()
    meta = {
        "size": clip.size,
        "fps": clip.fps,
        "frames": clip.frames,
        "scene": clip.scene,
        "walkers": [asdict(w) for w in clip.walkers],
        "truth": [[asdict(t) for t in frame] for frame in clip.truth],
    }
    truth_path = path.with_suffix(".json")
    truth_path.write_text(json.dumps(meta), encoding="utf-8")
    return truth_path


_NOISE_FRAMES = 4


@functools.cache
def _scene(name: str, size: tuple[int, int]) -> Image:
    width, height = size
    photo = sample(name)
    photo = np.repeat(photo[:, :, None], 3, axis=2) if photo.ndim == 2 else bgr(photo)
    size_tall = (round(photo.shape[1] * height / photo.shape[0]), height)
    wide = np.asarray(cv2.resize(photo, size_tall, interpolation=cv2.INTER_AREA), dtype=np.uint8)
    while wide.shape[1] < width:
        wide = np.concatenate([wide, wide[:, ::-1]], axis=1)
    left = (wide.shape[1] - width) // 2
    scene = np.ascontiguousarray(wide[:, left : left + width], dtype=np.uint8)
    scene.flags.writeable = False
    return scene


@functools.cache
def _figure(height: int) -> Image:
    x0, y0, x1, y1 = FIGURE
    photo = bgr(sample("astronaut"))[y0:y1, x0:x1]
    width = max(1, round(height * (x1 - x0) / (y1 - y0)))
    figure = np.asarray(
        cv2.resize(photo, (width, height), interpolation=cv2.INTER_AREA), dtype=np.uint8
    )
    figure.flags.writeable = False
    return figure


@functools.cache
def _noise(size: tuple[int, int], sigma: float, seed: int, index: int) -> tuple[Image, Image]:
    rng = np.random.default_rng((seed, index))
    values = rng.normal(0.0, sigma, (size[1], size[0], 3))
    up = np.clip(values, 0, 255).astype(np.uint8)
    down = np.clip(-values, 0, 255).astype(np.uint8)
    return up, down


def _paste(image: Image, figure: Image, x: int, y: int) -> None:
    height, width = image.shape[:2]
    fh, fw = figure.shape[:2]
    x0, y0, x1, y1 = max(x, 0), max(y, 0), min(x + fw, width), min(y + fh, height)
    if x1 > x0 and y1 > y0:
        image[y0:y1, x0:x1] = figure[y0 - y : y1 - y, x0 - x : x1 - x]
