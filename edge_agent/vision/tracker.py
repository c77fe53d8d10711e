"""A small SORT-like tracker: stable ids for a stream's detections, whatever region found them.

Each track carries its box and a velocity; on a new frame each track's box is moved by
its velocity to the frame's time, and detections are matched to those guesses greedily
by IoU (highest first, same label only). A fast walker whose guess misses by more than
the IoU can bridge is still matched when the centres are within half the track's box
diagonal. Unmatched detections start tracks; tracks unseen for `end_after_s` end.

Events have Frigate's shape: "new" when a track starts, "update" each frame it is seen,
"end" when it is dropped. Pure: stream timestamps in, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from edge_agent.heads.base import Detection
from edge_agent.heads.boxes import iou

Box = npt.NDArray[np.float64]

_TS_SLACK = 1e-9
"""Timestamps are sums of frame periods; without slack an absence of exactly
`end_after_s` would end a track one frame late (as in pipelines.events)."""

SMOOTHING = 0.5
"""Weight of the newest measured velocity against the track's previous one."""


@dataclass(slots=True)
class Track:
    """One object followed across frames."""

    id: int
    label: str
    box: Box
    """Last seen box, frame pixels."""
    velocity: Box
    """Pixels per second of the box's centre (x, y). Its size is not extrapolated: a
    person's box grows while they step in from a frame edge, and carrying that growth on
    through a few missed frames gives a guess far too big to look in."""
    size: Box
    """Smoothed (width, height): one loose box from the model does not make the guess,
    and so the region looked in, too big to see the object well."""
    score: float
    first_ts: float
    last_ts: float
    hits: int = 1
    missed: int = 0
    """Updates since it was last matched: 0 means seen in the latest frame."""

    def predict(self, ts: float) -> Box:
        """Where the box should be at `ts`."""
        centre = _centre(self.box) + self.velocity * max(0.0, ts - self.last_ts)
        guess: Box = np.concatenate([centre - self.size / 2, centre + self.size / 2])
        return guess


@dataclass(frozen=True, slots=True)
class TrackEvent:
    """A track started, was seen again, or ended."""

    kind: Literal["new", "update", "end"]
    id: int
    label: str
    box: tuple[float, float, float, float]
    score: float
    ts: float


class Tracker:
    """Follows a stream's detections (after tiles or regions were merged).

    Args:
        iou_threshold: a detection matches a track's guess above this IoU.
        end_after_s: a track unseen this long (stream time) ends.
    """

    def __init__(self, iou_threshold: float = 0.2, end_after_s: float = 2.0) -> None:
        self.iou_threshold = iou_threshold
        self.end_after_s = end_after_s
        self.tracks: list[Track] = []
        self._next_id = 1

    def predicted(self, ts: float) -> list[tuple[int, Box]]:
        """Live tracks' guessed boxes at `ts`: where the regions planner should look."""
        return [(t.id, t.predict(ts)) for t in self.tracks]

    def guesses(self, ts: float) -> tuple[list[Box], list[Box]]:
        """Guessed boxes at `ts` of the tracks seen in the latest frame, and of the others.

        `RegionPlanner.plan(ts, motion, seen, lost)` takes them: motion near a track just
        seen is that track moving, while motion near a track the model just missed may be
        where it really is.
        """
        seen = [t.predict(ts) for t in self.tracks if t.missed == 0]
        lost = [t.predict(ts) for t in self.tracks if t.missed > 0]
        return seen, lost

    def update(self, ts: float, detections: list[Detection]) -> list[TrackEvent]:
        """Feed one frame's detections; return the events, ends first."""
        events: list[TrackEvent] = []
        boxes = np.array([d.box for d in detections], dtype=np.float64).reshape(-1, 4)
        guesses = [t.predict(ts) for t in self.tracks]
        pairs: list[tuple[float, int, int]] = []
        for ti, (track, guess) in enumerate(zip(self.tracks, guesses, strict=True)):
            if not len(boxes):
                break
            overlap = iou(guess, boxes)
            near = _centre_near(guess, boxes)
            for di, det in enumerate(detections):
                if det.label != track.label:
                    continue
                if overlap[di] > self.iou_threshold:
                    pairs.append((float(overlap[di]) + 1.0, ti, di))
                elif near[di]:
                    pairs.append((float(overlap[di]), ti, di))
        matched_t: set[int] = set()
        matched_d: set[int] = set()
        for _, ti, di in sorted(pairs, reverse=True):
            if ti in matched_t or di in matched_d:
                continue
            matched_t.add(ti)
            matched_d.add(di)
            self._refresh(self.tracks[ti], boxes[di], detections[di].score, ts)
            events.append(_event("update", self.tracks[ti], ts))
        kept: list[Track] = []
        for ti, track in enumerate(self.tracks):
            if ti not in matched_t:
                track.missed += 1
            if ti not in matched_t and ts - track.last_ts >= self.end_after_s - _TS_SLACK:
                events.insert(0, _event("end", track, ts))
            else:
                kept.append(track)
        self.tracks = kept
        for di, det in enumerate(detections):
            if di in matched_d:
                continue
            track = Track(
                self._next_id,
                det.label,
                boxes[di].copy(),
                np.zeros(2),
                boxes[di, 2:] - boxes[di, :2],
                det.score,
                ts,
                ts,
            )
            self._next_id += 1
            self.tracks.append(track)
            events.append(_event("new", track, ts))
        return events

    def flush(self, ts: float) -> list[TrackEvent]:
        """End of stream: end every live track."""
        events = [_event("end", t, ts) for t in self.tracks]
        self.tracks = []
        return events

    @staticmethod
    def _refresh(track: Track, box: Box, score: float, ts: float) -> None:
        dt = ts - track.last_ts
        if dt > 0:
            measured = (_centre(box) - _centre(track.box)) / dt
            track.velocity = SMOOTHING * measured + (1 - SMOOTHING) * track.velocity
        track.size = SMOOTHING * (box[2:] - box[:2]) + (1 - SMOOTHING) * track.size
        track.box = box.copy()
        track.missed = 0
        track.score = score
        track.last_ts = ts
        track.hits += 1


def _centre(box: Box) -> Box:
    centre: Box = (box[:2] + box[2:]) / 2
    return centre


def _centre_near(guess: Box, boxes: Box) -> npt.NDArray[np.bool_]:
    centre = _centre(guess)
    centres = (boxes[:, :2] + boxes[:, 2:]) / 2
    reach = 0.5 * float(np.hypot(guess[2] - guess[0], guess[3] - guess[1]))
    return np.asarray(np.hypot(*(centres - centre).T) <= reach, dtype=np.bool_)


def _event(kind: Literal["new", "update", "end"], track: Track, ts: float) -> TrackEvent:
    x0, y0, x1, y1 = (float(v) for v in track.box)
    return TrackEvent(kind, track.id, track.label, (x0, y0, x1, y1), track.score, ts)
