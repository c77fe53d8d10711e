"""Zones and masks of one camera: named polygons, and polygons that hide things.

- A `[[zones]]` entry is a named polygon. A detection is in the zone when its bottom
  centre (where a standing person's feet are) is inside, as in Frigate: a person whose
  head crosses a doorway's polygon while they walk past it is not in the doorway.
- A `[[masks]]` entry drops detections and motion inside it. A detection is masked by the
  same bottom-centre rule, not by box overlap: masks are drawn around things that fool the
  detector (a poster, a TV, a swaying tree), and a real person walking in front of a
  masked tree overlaps it by a large fraction of their box while their feet stay outside.
  The same rule for zones and masks also means one mental model for the operator.

Points are in frame pixels, or in fractions of the frame's width and height
(`units = "fraction"`), so one spec serves a camera at any resolution.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Annotated, Literal

import cv2
import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, model_validator

from edge_agent.config_files import is_recorded
from edge_agent.heads.base import Detection, Result
from edge_agent.logs import Throttle, log_event
from edge_agent.vision.geometry import Rect

log = logging.getLogger(__name__)

Units = Literal["px", "fraction"]
Coordinate = Annotated[float, Field(allow_inf_nan=False)]
"""A corner's x or y: NaN or infinity would make every inside() test false (and numpy warn
casting it) instead of failing where the spec is read."""
Points = npt.NDArray[np.float64]


_SAID_AS_PIXELS = Throttle(math.inf)
"""Recorded zones warned of as fractions read as pixels: once each, in this process."""


class _Polygon(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    points: tuple[tuple[Coordinate, Coordinate], ...] = Field(
        min_length=3,
        description='Corners (x, y) in order, in frame pixels or (units = "fraction") 0-1.',
    )
    units: Units = Field(
        default="px",
        description='"px": frame pixels; "fraction": fractions of the frame width and height.',
    )

    @model_validator(mode="after")
    def _not_fractions_read_as_pixels(self, info: ValidationInfo) -> _Polygon:
        # Pixels are the default unit: a zone drawn in fractions without `units` was a
        # polygon 1 px across in the top-left corner, matching nothing (and in tiles or
        # regions mode shrinking the sweep to one tile), with nothing said anywhere.
        if self.units == "px" and all(0 <= v <= 1 for point in self.points for v in point):
            kind = type(self).__name__.lower()
            name = getattr(self, "name", "")
            if is_recorded(info):
                # An earlier build's record: kept as it served (a mask 1 px across still
                # let the camera detect), said once a process, not refused (a restore
                # reads a record more than once, and calibration reads it again).
                if not _SAID_AS_PIXELS.ready((kind, name, self.points)):
                    return self
                log_event(
                    log,
                    logging.WARNING,
                    "zone_in_fractions_as_pixels",
                    kind=kind,
                    name=name,
                    fix='add units = "fraction" and start the pipeline again',
                )
                return self
            raise ValueError(
                f"{kind}{f' {name!r}' if name else ''} has every point within 0-1 but its"
                " units are pixels (a polygon 1 pixel across); for fractions of the frame"
                ' add units = "fraction"'
            )
        return self

    def polygon(self, frame_size: tuple[int, int]) -> Points:
        """The corners in frame pixels, [K, 2] float64."""
        pts = np.asarray(self.points, dtype=np.float64)
        if self.units == "fraction":
            pts = pts * np.asarray(frame_size, dtype=np.float64)
        return pts


class Zone(_Polygon):
    """A named area of the frame; event rules can name it."""

    name: str = Field(min_length=1, description="Zone name, used by event rules and results.")


class Mask(_Polygon):
    """An area whose detections and motion are ignored."""

    name: str = Field(default="", description="Optional name, for logs and drawings.")


def bottom_centres(boxes: npt.ArrayLike) -> Points:
    """Bottom centre (x, y) of each [N, 4] x_min, y_min, x_max, y_max box."""
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    return np.stack([(b[:, 0] + b[:, 2]) / 2, b[:, 3]], axis=1)


def inside(polygon: Points, points: npt.ArrayLike) -> npt.NDArray[np.bool_]:
    """Which of [N, 2] points lie inside `polygon` ([K, 2]), by the even-odd rule.

    A point exactly on an edge may fall either way, as with any ray cast; that is half a
    pixel, and the rule is the same for every frame.
    """
    pts = np.asarray(points, dtype=np.float64).reshape(-1, 2)
    x, y = pts[:, 0:1], pts[:, 1:2]
    ax, ay = polygon[:, 0], polygon[:, 1]
    bx, by = np.roll(ax, -1), np.roll(ay, -1)
    # Edges that straddle the horizontal line through the point, crossed to its right.
    straddle = (ay > y) != (by > y)
    with np.errstate(divide="ignore", invalid="ignore"):
        cross_x = ax + (y - ay) * (bx - ax) / (by - ay)
    crossings = np.sum(straddle & (x < cross_x), axis=1)
    return np.asarray(crossings % 2 == 1, dtype=np.bool_)


class Scene:
    """A camera's zones and masks resolved for one frame size; pure, cheap to query."""

    def __init__(
        self, frame_size: tuple[int, int], zones: Sequence[Zone] = (), masks: Sequence[Mask] = ()
    ) -> None:
        self.frame_size = frame_size
        self.zones = tuple(zones)
        self.masks = tuple(masks)
        self._zones = [z.polygon(frame_size) for z in self.zones]
        self._masks = [m.polygon(frame_size) for m in self.masks]

    def masked(self, boxes: npt.ArrayLike) -> npt.NDArray[np.bool_]:
        """Per box: its bottom centre is under a mask, so the detection is dropped."""
        feet = bottom_centres(boxes)
        hit = np.zeros(len(feet), dtype=np.bool_)
        for polygon in self._masks:
            hit |= inside(polygon, feet)
        return hit

    def zones_of(self, boxes: npt.ArrayLike) -> list[tuple[str, ...]]:
        """Per box: the names of the zones its bottom centre is in, in spec order."""
        feet = bottom_centres(boxes)
        hits = [inside(polygon, feet) for polygon in self._zones]
        return [
            tuple(z.name for z, hit in zip(self.zones, hits, strict=True) if hit[i])
            for i in range(len(feet))
        ]

    def unmasked(self, results: Sequence[Result]) -> list[Result]:
        """`results` without the detections a mask hides; other results pass unchanged."""
        detections = [r for r in results if isinstance(r, Detection)]
        if not self._masks or not detections:
            return list(results)
        hidden = self.masked([d.box for d in detections])
        drop = {id(d) for d, h in zip(detections, hidden, strict=True) if h}
        return [r for r in results if id(r) not in drop]

    def zones_of_results(self, results: Sequence[Result]) -> list[tuple[str, ...]]:
        """Per result: the zones a detection's bottom centre is in (`zones_of`), () for
        results without a box (classes, text, speech). Event rules that name a zone and
        the zones reported with results and detection events all come from here."""
        indexed = [(i, r.box) for i, r in enumerate(results) if isinstance(r, Detection)]
        zones: list[tuple[str, ...]] = [() for _ in results]
        if not indexed or not self.zones:
            return zones
        for (i, _), names in zip(indexed, self.zones_of([b for _, b in indexed]), strict=True):
            zones[i] = names
        return zones

    def outside(self) -> list[tuple[str, str]]:
        """(kind, name) of each zone and mask that lies wholly outside the frame: drawn
        for another resolution, or in pixels where fractions were meant."""
        width, height = self.frame_size
        shapes = [
            *(("zone", z.name, p) for z, p in zip(self.zones, self._zones, strict=True)),
            *(("mask", m.name, p) for m, p in zip(self.masks, self._masks, strict=True)),
        ]
        return [
            (kind, name)
            for kind, name, polygon in shapes
            if polygon[:, 0].min() >= width
            or polygon[:, 1].min() >= height
            or polygon[:, 0].max() <= 0
            or polygon[:, 1].max() <= 0
        ]

    def zone_bounds(self) -> list[Rect]:
        """Each zone's bounding rectangle in frame pixels, cut to the frame (for tiles)."""
        width, height = self.frame_size
        rects: list[Rect] = []
        for polygon in self._zones:
            x0, y0 = np.floor(polygon.min(axis=0)).astype(int)
            x1, y1 = np.ceil(polygon.max(axis=0)).astype(int)
            rect = (max(int(x0), 0), max(int(y0), 0), min(int(x1), width), min(int(y1), height))
            if rect[2] > rect[0] and rect[3] > rect[1]:
                rects.append(rect)
        return rects

    def motion_mask(self, size: tuple[int, int]) -> npt.NDArray[np.uint8] | None:
        """A (height, width) uint8 image at `size` (the motion detector's), 0 under masks.

        Returns:
            None when there are no masks, so the caller skips the multiply.
        """
        if not self._masks:
            return None
        width, height = size
        image = np.full((height, width), 255, dtype=np.uint8)
        factor = np.array([width / self.frame_size[0], height / self.frame_size[1]])
        polygons = [np.round(p * factor).astype(np.int32) for p in self._masks]
        cv2.fillPoly(image, polygons, 0)
        return image
