"""Which squares of a frame to run the model on: the `regions` detection mode's scheduler.

Frigate's idea, with its loose ends tied:
- moving areas (from `MotionDetector`) and the guessed boxes of tracked objects (from
  `Tracker.predicted`, so a person who stops walking is still looked at) are clustered
  into square regions, each no smaller than the model's input (a smaller one would be
  upscaled: no detail gained, a call spent) and no larger than its boxes need;
- a region is sized from its boxes and from what the camera usually sees there: a
  `RegionGrid` learns the size of confirmed objects per cell of an 8x8 grid (Frigate's
  `get_camera_regions_grid`), so a hand waving is looked at with room for the whole
  person. The grid keeps a count, mean and spread per cell (bounded, not every size
  ever seen) and is saved as JSON in the state directory (`Layout.regions(pipeline)`);
- every `sweep_every_s` the whole frame is swept with overlapping tiles, to catch what
  arrived without moving; a sweep can be spread over a few frames to keep latency flat;
- when the regions would cost as many calls as a sweep, the sweep runs instead.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from edge_agent.errors import EdgeAgentError
from edge_agent.vision.geometry import Rect
from edge_agent.vision.tiles import tile_grid

GRID = 8
MARGIN = 1.35
"""A tracked object's region side over its box's long side: room to move (Frigate's)."""
LOST_MARGIN = 1.15
"""The same for a track the model just missed: look again, tighter and so larger."""
MOTION_MARGIN = 1.0
"""The same for a motion box, which already carries slack (dilation, the ghost trail).

Why margins matter: person-ssdlite finds a person reliably only while they fill about 60%
of its input's height or more. Measured on the 720p clips, a 212 px person is found in
15/15 crops of 300 px, 5-9/15 of 360 px and 0/15 of 420 px."""
MIN_COUNT = 5
"""Objects seen in a cell before its learned size is trusted."""
MAX_COUNT = 500
"""Past this count a cell's statistics forget old objects at a 1/MAX_COUNT rate."""

EXPLAINED = 0.5
"""Motion this much inside a tracked object's region is put down to that object."""

BoxLike = Sequence[float] | npt.NDArray[np.float64]


class RegionGrid:
    """The usual size of objects, per cell of a GRID x GRID grid over the frame.

    Sizes are the long side of confirmed boxes as a fraction of the frame height, so a
    grid learned at 1080p serves the same camera at 720p.
    """

    def __init__(self) -> None:
        self.count = np.zeros((GRID, GRID), dtype=np.float64)
        self.mean = np.zeros((GRID, GRID), dtype=np.float64)
        self.var = np.zeros((GRID, GRID), dtype=np.float64)

    @staticmethod
    def _cell(frame_size: tuple[int, int], x: float, y: float) -> tuple[int, int]:
        col = min(GRID - 1, max(0, int(x / frame_size[0] * GRID)))
        row = min(GRID - 1, max(0, int(y / frame_size[1] * GRID)))
        return row, col

    def observe(self, frame_size: tuple[int, int], box: BoxLike) -> None:
        """Learn from one confirmed object's box (frame pixels), filed at its centre."""
        x0, y0, x1, y1 = (float(v) for v in box)
        size = max(x1 - x0, y1 - y0) / frame_size[1]
        cell = self._cell(frame_size, (x0 + x1) / 2, (y0 + y1) / 2)
        # Running mean and variance with weight 1/n: exact while n <= MAX_COUNT, then a
        # moving average, so a camera that was moved relearns its sizes.
        n = self.count[cell] + 1
        weight = 1.0 / min(n, MAX_COUNT)
        delta = size - self.mean[cell]
        self.mean[cell] += weight * delta
        self.var[cell] = (1 - weight) * (self.var[cell] + weight * delta * delta)
        self.count[cell] = n

    def expected(
        self, frame_size: tuple[int, int], x: float, y: float
    ) -> tuple[float, float] | None:
        """Mean and standard deviation of object size (frame pixels) at (x, y), if known."""
        cell = self._cell(frame_size, x, y)
        n = self.count[cell]
        if n < MIN_COUNT:
            return None
        std = math.sqrt(self.var[cell])
        return float(self.mean[cell]) * frame_size[1], std * frame_size[1]

    def to_json(self) -> str:
        return json.dumps(
            {
                "version": 1,
                "grid": GRID,
                "count": self.count.tolist(),
                "mean": self.mean.tolist(),
                "var": self.var.tolist(),
            }
        )

    @classmethod
    def from_json(cls, text: str) -> RegionGrid:
        """Parse `to_json`'s output.

        Raises:
            EdgeAgentError: `input.unreadable`, the text is not a grid this version wrote.
        """
        grid = cls()
        try:
            data = json.loads(text)
            if data.get("version") != 1 or data.get("grid") != GRID:
                raise ValueError("unknown version or grid size")
            for name in ("count", "mean", "var"):
                values = np.asarray(data[name], dtype=np.float64)
                if values.shape != (GRID, GRID) or not np.all(np.isfinite(values)):
                    raise ValueError(f"bad {name}")
                setattr(grid, name, values)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise EdgeAgentError(
                f"the learned region grid is unreadable: {exc}",
                "delete the file; the camera learns its object sizes again",
                code="input.unreadable",
            ) from None
        return grid

    @classmethod
    def load(cls, path: Path) -> RegionGrid:
        """The grid saved at `path`, or an empty one when there is none yet."""
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return cls()
        return cls.from_json(text)

    def save(self, path: Path) -> None:
        """Write atomically (temp file, then rename), so a crash leaves the old grid."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(self.to_json(), encoding="utf-8")
        tmp.replace(path)


def square_around(box: BoxLike, side: float, frame_size: tuple[int, int]) -> Rect:
    """A square of `side` centred on `box`, shifted (not cut) to lie inside the frame.

    A side longer than the frame's short side is cut to the frame there; the geometry
    then letterboxes the rectangle, so the picture keeps its aspect.
    """
    width, height = frame_size
    s = max(1, round(side))
    cx, cy = (box[0] + box[2]) / 2, (box[1] + box[3]) / 2
    x0 = min(max(0, round(cx - s / 2)), max(0, width - s))
    y0 = min(max(0, round(cy - s / 2)), max(0, height - s))
    return (x0, y0, min(width, x0 + s), min(height, y0 + s))


class RegionPlanner:
    """Picks the regions to run for each frame of one stream.

    Args:
        frame_size: (width, height).
        model_side: the model input's longer side: the smallest region.
        tile: the sweep's tile side; default half the frame height (360 px at 720p,
            540 at 1080p), and never under `model_side`.
        overlap: the sweep tiles' overlap.
        sweep_every_s: stream seconds between full sweeps (0: every frame).
        sweep_frames: spread each sweep's tiles over this many frames.
        grid: learned object sizes, or None to size from the boxes alone.
        bounds: the zones' bounding boxes; the sweep covers only them when given.
    """

    def __init__(
        self,
        frame_size: tuple[int, int],
        model_side: int,
        tile: int | None = None,
        overlap: float = 0.2,
        sweep_every_s: float = 5.0,
        sweep_frames: int = 1,
        grid: RegionGrid | None = None,
        bounds: Sequence[Rect] = (),
    ) -> None:
        self.frame_size = frame_size
        self.model_side = model_side
        self.tile = max(model_side, tile or frame_size[1] // 2)
        self.sweep_every_s = sweep_every_s
        self.sweep_frames = max(1, sweep_frames)
        self.grid = grid
        self.sweep_tiles = tile_grid(frame_size, self.tile, overlap, bounds)
        self._pending: list[Rect] = []
        self._next_sweep: float | None = None

    def learn(self, boxes: Sequence[BoxLike]) -> None:
        """Teach the grid the confirmed objects of a frame (no-op without a grid)."""
        if self.grid is not None:
            for box in boxes:
                self.grid.observe(self.frame_size, box)

    def side_for(self, box: BoxLike, margin: float = MARGIN) -> float:
        """The region side `box` needs: its long side with `margin`, or the usual size here."""
        long_side = max(box[2] - box[0], box[3] - box[1])
        side = margin * long_side
        if self.grid is not None:
            usual = self.grid.expected(
                self.frame_size, (box[0] + box[2]) / 2, (box[1] + box[3]) / 2
            )
            if usual is not None and long_side < usual[0] - usual[1]:
                # Only part of an object moved here (an arm): look at the whole of it.
                side = MARGIN * usual[0]
        return max(float(self.model_side), side)

    def plan(
        self,
        ts: float,
        motion: Sequence[BoxLike],
        tracked: Sequence[BoxLike] = (),
        lost: Sequence[BoxLike] = (),
    ) -> list[Rect]:
        """The regions to run on the frame at `ts`.

        Args:
            ts: stream time of the frame, seconds.
            motion: moving boxes in frame pixels (`MotionDetector.detect`).
            tracked: guessed boxes of the tracks seen in the latest frame, frame pixels
                (`Tracker.guesses`); motion mostly inside their regions is theirs.
            lost: guessed boxes of live tracks the model missed lately; they get a region
                too, but explain no motion, which then gets its own region.

        Returns:
            Rectangles of the frame, one model call each; sweep tiles come first.
        """
        if (
            self._next_sweep is None
            or ts >= self._next_sweep - 1e-9
            or ts < self._next_sweep - self.sweep_every_s - 1e-9
        ):
            # Due, first frame, or time went backwards (a source restarted its clock).
            self._pending = list(self.sweep_tiles)
            self._next_sweep = ts + self.sweep_every_s
        sweep: list[Rect] = []
        if self._pending:
            share = math.ceil(len(self.sweep_tiles) / self.sweep_frames)
            sweep, self._pending = self._pending[:share], self._pending[share:]
        followed = [b for b in (self._clip(t) for t in tracked) if b is not None]
        around = [square_around(b, self.side_for(b), self.frame_size) for b in followed]
        # Motion mostly inside a tracked object's region is that object moving (and its
        # ghost trail): its region already looks there, tighter than the motion box would.
        moving = [
            b
            for b in (self._clip(m) for m in motion)
            if b is not None and not any(_covered(b, r) >= EXPLAINED for r in around)
        ]
        missing = [b for b in (self._clip(t) for t in lost) if b is not None]
        regions = self._cluster(
            [(b, MARGIN) for b in followed]
            + [(b, LOST_MARGIN) for b in missing]
            + [(b, MOTION_MARGIN) for b in moving]
        )
        regions = [r for r in regions if not any(_contains(t, r) for t in sweep)]
        if len(regions) >= len(self.sweep_tiles):
            # As dear as a sweep: sweep instead, and see everything.
            self._pending = []
            return list(self.sweep_tiles)
        return sweep + regions

    def _clip(self, box: BoxLike) -> tuple[float, float, float, float] | None:
        width, height = self.frame_size
        x0, y0 = max(0.0, float(box[0])), max(0.0, float(box[1]))
        x1, y1 = min(float(width), float(box[2])), min(float(height), float(box[3]))
        return (x0, y0, x1, y1) if x1 > x0 and y1 > y0 else None

    def _cluster(self, items: list[tuple[tuple[float, float, float, float], float]]) -> list[Rect]:
        """Greedy over (box, margin), largest box first: a box joins a cluster when the
        region holding both is hardly bigger than the bigger of their own regions."""
        clusters: list[tuple[tuple[float, float, float, float], float]] = []
        for box, margin in sorted(items, key=lambda i: -(i[0][2] - i[0][0]) * (i[0][3] - i[0][1])):
            side = self.side_for(box, margin)
            for k, (members, need) in enumerate(clusters):
                union = (
                    min(members[0], box[0]),
                    min(members[1], box[1]),
                    max(members[2], box[2]),
                    max(members[3], box[3]),
                )
                joined = max(self.side_for(union, 1.0), need, side)
                if joined <= max(need, side) * 1.1:
                    clusters[k] = (union, joined)
                    break
            else:
                clusters.append((box, side))
        regions = [square_around(box, side, self.frame_size) for box, side in clusters]
        # A region inside another adds nothing.
        return [
            r
            for i, r in enumerate(regions)
            if not any(
                j != i and _contains(o, r) and (o != r or j < i) for j, o in enumerate(regions)
            )
        ]


def _contains(outer: Rect, inner: Rect) -> bool:
    return (
        outer[0] <= inner[0]
        and outer[1] <= inner[1]
        and outer[2] >= inner[2]
        and outer[3] >= inner[3]
    )


def _covered(box: tuple[float, float, float, float], region: Rect) -> float:
    """The fraction of `box` inside `region`."""
    w = min(box[2], region[2]) - max(box[0], region[0])
    h = min(box[3], region[3]) - max(box[1], region[1])
    area = (box[2] - box[0]) * (box[3] - box[1])
    return max(0.0, w) * max(0.0, h) / area if area > 0 else 0.0
