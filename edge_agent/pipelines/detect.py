"""Where a vision pipeline's model looks in each frame: the `[detect]` modes, per stream.

`Detector.plan` (the reader thread) gives the geometries of a frame's model calls:
- "frame": one, the whole frame fitted as the manifest says (cached per frame size);
- "tiles": one per square tile over the frame, or over the zones when there are zones;
- "regions": motion and tracked objects clustered into squares by `RegionPlanner`,
  with a tiled sweep every `sweep_every_s`; none at all on a still scene between sweeps.

`Detector.combine` (the emitter thread, in frame order) maps every call's results back
through its own geometry, merges what overlapping calls found, drops what masks hide,
feeds the tracker (regions), and says which detections are in which zone.

A frame decoded at a reduced JPEG scale (`Frame.scale` above 1) is planned and combined
in its decoded pixels; the Detector is the one owner of that conversion both ways:
pixel-unit zones and masks come down to it, and results go back up to the camera's
pixels (`mapping.to_camera`) as the last step of `combine`. `min_size` tells the source
how far a frame may be reduced for this mode and model.

The reader plans frame k while the emitter may still be combining frame k-1, so the
tracker and the learned grid are shared under one lock; the planner looks where tracks
are guessed to be at the frame's time, so a frame or two of lag costs nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from threading import Lock
from typing import TypeVar

from edge_agent.catalog.manifest import TASK_HEADS, ImageInput, Manifest
from edge_agent.errors import EdgeAgentError
from edge_agent.heads.base import Detection, Result
from edge_agent.logs import Throttle, log_event
from edge_agent.pipelines.base import Frame
from edge_agent.pipelines.decode import MinSize, min_size_for_fit, min_size_for_tiles
from edge_agent.pipelines.spec import DetectSpec
from edge_agent.runtime.preprocess import input_geometry
from edge_agent.vision.geometry import Geometry, Rect
from edge_agent.vision.mapping import to_camera, to_frame
from edge_agent.vision.motion import MotionDetector
from edge_agent.vision.regions import RegionGrid, RegionPlanner
from edge_agent.vision.tiles import merge_detections, tile_grid
from edge_agent.vision.tracker import Tracker
from edge_agent.vision.zones import Mask, Scene, Zone

log = logging.getLogger(__name__)

SAVE_EVERY_S = 60.0
"""Stream seconds between saves of the learned grid (and once at the end)."""
GEOMETRY_CACHE = 512
"""Geometries kept per stream; regions make new rectangles every frame, tiles do not."""

OUTSIDE_LOG_S = 3600.0
"""At most one `zone_outside_frame` line per zone or mask this often: a folder source
whose every image has another size would otherwise say it for each image."""

Size = tuple[int, int]

BOX_HEADS = tuple(h for h in TASK_HEADS["detection"] if h != "raw")
"""The heads whose results are boxes of objects: the only ones tiles and regions merge.
A text or classification head's results were appended once per call: two copies of a
text line in the overlap of two tiles, fifteen classifications of one frame."""


def check_mode(mode: str, manifest: Manifest) -> None:
    """Refuse a `[detect]` mode that cannot serve `manifest`'s head.

    Raises:
        EdgeAgentError: `model.incompatible`, tiles or regions with a head that is not
            a detector's.
    """
    head = manifest.head.type
    if mode == "frame" or head in BOX_HEADS:
        return
    raise EdgeAgentError(
        f'{manifest.name} has a {head} head, and detect mode "{mode}" is for detectors'
        f" ({', '.join(BOX_HEADS)} heads)",
        f'use mode = "frame" with a {head} head',
        code="model.incompatible",
    )


@dataclass(slots=True)
class _View:
    """What one (frame size, model size) needs: built on the first such frame."""

    scene: Scene
    tiles: list[Geometry]
    motion: MotionDetector | None
    planner: RegionPlanner | None


class Detector:
    """One stream's detection mode: plans each frame's calls and combines their results.

    Args:
        spec: the pipeline's `[detect]` table.
        zones: the pipeline's zones (frame pixels or fractions).
        masks: the pipeline's masks.
        grid_path: where the regions mode keeps its learned grid (`Layout.regions(id)`);
            None keeps it in memory only.
    """

    def __init__(
        self,
        spec: DetectSpec | None = None,
        zones: Sequence[Zone] = (),
        masks: Sequence[Mask] = (),
        grid_path: Path | None = None,
    ) -> None:
        self.spec = spec or DetectSpec()
        self.mode = self.spec.mode
        self.zones = tuple(zones)
        self.masks = tuple(masks)
        self.tracker = Tracker()
        self._grid_path = grid_path
        self._grid: RegionGrid | None = None
        if self.mode == "regions" and self.spec.learn:
            self._grid = _load_grid(grid_path)
        self._lock = Lock()
        self._views: dict[tuple[Size, Size, int], _View] = {}
        self._geometries: dict[tuple[Size, Rect | None, ImageInput], Geometry] = {}
        # Mode "frame"'s one geometry, found by identity: a key into `_geometries` hashes
        # the input spec (a pydantic model) on every frame, with the reader's caches cold.
        # `plan` took 6 us a frame with this against 17 us (person-ssdlite, 2 cores, thread
        # CPU, medians with the two alternating frame by frame).
        self._whole: tuple[Size, ImageInput, Geometry] | None = None
        self._saved_ts: float | None = None
        self._outside = Throttle(OUTSIDE_LOG_S)

    def min_size(self, image: ImageInput) -> MinSize:
        """The smallest decode of a frame that loses nothing the model would see, for the
        source's reduced JPEG decode: the fitted input in mode "frame", else the tiles'."""
        if self.mode == "frame":
            return min_size_for_fit((image.width, image.height), image.fit)
        return min_size_for_tiles(max(image.width, image.height), self.spec.tile)

    def plan(self, frame: Frame, image: ImageInput) -> list[Geometry]:
        """The model calls for `frame`, each as the geometry of its input (reader thread)."""
        size = (frame.image.shape[1], frame.image.shape[0])
        if self.mode == "frame":
            return [self._geometry(size, image, None)]
        view = self._view(size, image, frame.scale)
        if self.mode == "tiles":
            return view.tiles
        if view.motion is None or view.planner is None:
            return []  # unreachable: a regions view always has both
        moving = view.motion.detect(frame.image)
        with self._lock:
            seen, lost = self.tracker.guesses(frame.ts)
            rects = view.planner.plan(frame.ts, moving, seen, lost)
        return [self._geometry(size, image, r) for r in rects]

    def combine(
        self,
        frame: Frame,
        image: ImageInput,
        parts: Sequence[tuple[Geometry, Sequence[Result]]],
    ) -> tuple[list[Result], list[tuple[str, ...]] | None]:
        """Results in frame pixels, merged and unmasked, and the zones of each.

        Args:
            frame: the frame the calls were made on.
            image: the input spec of the model that made them.
            parts: per call, its geometry and what the head decoded (model-input pixels).

        Returns:
            The frame's results, in the camera's pixels whatever scale the frame was
            decoded at; and per result the names of the zones its bottom centre is in
            (`Scene.zones_of_results`), or None when the pipeline has no zones.
        """
        size = (frame.image.shape[1], frame.image.shape[0])
        mapped = [(g, to_frame(found, g)) for g, found in parts]
        if self.mode == "frame":
            results = [r for _, found in mapped for r in found]
        else:
            per_call = [
                (g.crop, [r for r in found if isinstance(r, Detection)]) for g, found in mapped
            ]
            others = [r for _, found in mapped for r in found if not isinstance(r, Detection)]
            results = [*merge_detections(per_call, size), *others]
        view = self._view(size, image, frame.scale)
        results = view.scene.unmasked(results)
        if view.planner is not None:
            detections = [r for r in results if isinstance(r, Detection)]
            with self._lock:
                events = self.tracker.update(frame.ts, detections)
                # A detection matched to a track seen before is an object, not a one-frame
                # mistake: only those teach the grid what size things are here.
                view.planner.learn([e.box for e in events if e.kind == "update"])
            self._maybe_save(frame.ts)
        zones = view.scene.zones_of_results(results) if self.zones else None
        if frame.scale == 1:
            return results, zones
        return to_camera(results, frame.scale), zones

    def close(self) -> None:
        """Save the learned grid (regions), so the camera's next run starts from it."""
        self._save()

    def _view(self, size: Size, image: ImageInput, scale: int) -> _View:
        key = (size, (image.width, image.height), scale)
        view = self._views.get(key)
        if view is not None:
            return view
        # A frame decoded at 1/`scale` (reduced JPEG decode): pixel-unit zones, masks and
        # the tile side are the camera's pixels, so they shrink with it.
        scene = Scene(size, _scaled(self.zones, scale), _scaled(self.masks, scale))
        for kind, name in scene.outside():
            # Valid in the spec, yet never matching: a zone drawn for another camera's
            # resolution, or fractions given with units = "fraction" and pixel values.
            if self._outside.ready((kind, name)):
                log_event(
                    log,
                    logging.WARNING,
                    "zone_outside_frame",
                    kind=kind,
                    name=name,
                    frame=f"{size[0] * scale}x{size[1] * scale}",
                )
        model_side = max(image.width, image.height)
        tile = max(model_side, (self.spec.tile or size[1] * scale // 2) // scale)
        motion: MotionDetector | None = None
        planner: RegionPlanner | None = None
        tiles: list[Geometry] = []
        bounds = scene.zone_bounds()
        if self.mode == "tiles":
            rects = tile_grid(size, tile, self.spec.overlap, bounds)
            tiles = [self._geometry(size, image, r) for r in rects]
        elif self.mode == "regions":
            motion = MotionDetector(size)
            motion.mask = scene.motion_mask(motion.size)
            planner = RegionPlanner(
                size,
                model_side,
                tile,
                self.spec.overlap,
                self.spec.sweep_every_s,
                grid=self._grid,
                bounds=bounds,
            )
        view = _View(scene, tiles, motion, planner)
        self._views[key] = view
        return view

    def _geometry(self, size: Size, image: ImageInput, rect: Rect | None) -> Geometry:
        whole = self._whole
        if rect is None and whole is not None and whole[1] is image and whole[0] == size:
            return whole[2]
        key = (size, rect, image)
        found = self._geometries.get(key)
        if found is None:
            if len(self._geometries) >= GEOMETRY_CACHE:
                self._geometries.clear()
            # The manifest's fit is for whole frames. A tile or region is already the
            # model's shape, except where the frame's edge cut it: that one keeps its
            # aspect (measured on the 720p clip, regions' recall 0.975 against 0.950
            # stretched, for person-ssdlite, whose whole-frame fit is stretch).
            fitted = image if rect is None else image.model_copy(update={"fit": "letterbox"})
            found = input_geometry(fitted, size, rect)
            self._geometries[key] = found
        if rect is None:
            self._whole = (size, image, found)
        return found

    def _maybe_save(self, ts: float) -> None:
        if self._saved_ts is None or ts < self._saved_ts:
            self._saved_ts = ts
        elif ts - self._saved_ts >= SAVE_EVERY_S:
            self._saved_ts = ts
            self._save()

    def _save(self) -> None:
        if self._grid is None or self._grid_path is None:
            return
        try:
            with self._lock:
                self._grid.save(self._grid_path)
        except OSError as exc:
            # Learning is an optimisation: a read-only state dir must not stop detection.
            log_event(
                log,
                logging.WARNING,
                "region_grid_unsaved",
                path=str(self._grid_path),
                error=str(exc),
            )


Shape = TypeVar("Shape", Zone, Mask)


def _scaled(shapes: Sequence[Shape], scale: int) -> list[Shape]:
    return [
        s.model_copy(update={"points": tuple((x / scale, y / scale) for x, y in s.points)})
        if s.units == "px" and scale != 1
        else s
        for s in shapes
    ]


def _load_grid(path: Path | None) -> RegionGrid:
    if path is None:
        return RegionGrid()
    try:
        return RegionGrid.load(path)
    except EdgeAgentError as exc:
        log_event(log, logging.WARNING, "region_grid_reset", path=str(path), error=exc.problem)
        return RegionGrid()
    except OSError as exc:
        log_event(log, logging.WARNING, "region_grid_unreadable", path=str(path), error=str(exc))
        return RegionGrid()
