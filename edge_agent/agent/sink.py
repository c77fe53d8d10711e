"""The sink that turns a pipeline's results into the agent's messages.

A pipeline knows nothing of MQTT; this sink sits at its end and hands
`results/<pipeline>` and `events` messages to the agent's emitters (the
outbox). It runs on the pipeline's emitter thread, so it only builds small
messages and returns: the outbox write is a local sqlite insert.

- `results/<pipeline>` follows the config's `results` policy: every frame,
  only frames with results (the default), or nothing (events only).
- Detections are tracked (vision/tracker.py) into Frigate-shaped detection
  events: `new` when an object appears, `end` when it is gone (or the pipeline
  stops), and `update` only when it carries news: its score rose materially
  since the last one sent (at once), its box moved materially (at most once a
  stream second), or a long heartbeat passed. An object that stays put costs one
  event a minute, not one a second: 50 parked cars sent 4.3 M updates a day per
  camera. Updates are queued at the results' priority (`event_priority`), so a
  long outage drops them before `new`, `end` and command answers.
- Each result carries the zones of its detections (when the pipeline has zones), and
  each detection event the zones of its object's latest box; an object whose zones
  changed sends an update (at most once a stream second, as a move does).
- Pipeline events (a rule's appeared/gone, a source lost, a model swapped)
  become `events`, stamped with the box's clock; a failure's carries its code.
- A source lost, and the first frame after it, are marked on the pipeline's
  `SourceOutage`, which logs how long the source was down once it is back.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from edge_agent.agent.outage import SourceOutage
from edge_agent.heads.base import Detection
from edge_agent.heads.boxes import iou
from edge_agent.outbox import Priority
from edge_agent.pipelines.base import FrameResult
from edge_agent.protocol.agent import AgentEvent, DetectionEvent, ResultMessage
from edge_agent.vision.tracker import Tracker, TrackEvent

ResultsPolicy = Literal["all", "detections", "events"]

EmitResult = Callable[[str, ResultMessage], None]
"""(pipeline id, message): queue a result for `results/<pipeline>`."""
EmitEvent = Callable[[AgentEvent | DetectionEvent], None]
"""Queue an event for `events`."""

UPDATE_EVERY_S = 1.0
"""Least stream seconds between two `update` events of a moving object."""
HEARTBEAT_S = 60.0
"""Stream seconds after which an object that neither moved nor scored higher is said
again. Events are not retained, so a console that subscribed after an object's `new`
learns of it from the next update: a minute bounds that wait, and costs a parked car
1,440 events a day instead of the 86,400 a once-a-second update sent."""
MOVED_IOU = 0.8
"""An object moved when its box's IoU with the last box sent falls under this. A parked
car's box jitters by a few pixels from frame to frame (IoU above 0.9); a person walking
across the frame falls under it within a second."""
SCORE_RISE = 0.05
"""A best score this much above the last one sent is news. Smaller rises are the model's
noise and waited for the next update: the best score only rises, so each object sends at
most 1 / SCORE_RISE of these."""

_EVENT_KIND = {
    "source_error": "source_lost",
    "source_reconnecting": "source_lost",
    "model_swapped": "model_swapped",
}
_RUN_ENDS = frozenset({"pipeline_error"})
"""Pipeline events the agent says itself when the run ends (pipelines.Pipelines._run:
pipeline_failed, with the same code and detail): passed on too, every failure reached
the console twice, and a count of failures read double."""


@dataclass(slots=True)
class _Object:
    """What the detection events of one track need beyond the tracker's own state."""

    event_id: str
    start_time: float
    last_seen: float
    best_score: float
    updated_ts: float
    """Stream time of the last `new`/`update` event sent."""
    sent_box: tuple[float, float, float, float]
    """The box of the last `new`/`update` event sent."""
    sent_score: float
    """The score of the last `new`/`update` event sent."""
    zones: tuple[str, ...]
    """The zones of the object's latest box."""
    sent_zones: tuple[str, ...]
    """The zones of the last `new`/`update` event sent."""


def _moved(sent: tuple[float, float, float, float], box: tuple[float, float, float, float]) -> bool:
    overlap = iou(np.asarray(sent, dtype=np.float64), np.asarray([box], dtype=np.float64))
    return bool(overlap[0] < MOVED_IOU)


def event_priority(event: AgentEvent | DetectionEvent) -> Priority:
    """The outbox priority an event is queued at.

    A detection `update` repeats what its object's `new` said, with a newer box or score;
    the next update, or the `end`, says it again. It is dropped like a result over the
    outbox quota: queued as never-dropped, a yard of parked cars filled the quota during
    an outage and evicted every result, then competed with command answers.

    Returns:
        `Priority.RESULT` for a detection update, `Priority.CRITICAL` for every other event.
    """
    if isinstance(event, DetectionEvent) and event.type == "update":
        return Priority.RESULT
    return Priority.CRITICAL


class AgentSink:
    """Pipeline sink: results per the policy, events always.

    Args:
        pipeline: The pipeline id.
        policy: Which frames' results to publish.
        emit_result: Where results go.
        emit_event: Where events go.
        clock: Unix seconds, injectable.
        tracker: Follows detections across frames; a fresh one by default.
        outage: The pipeline's source outage record, shared by its runs; None: not kept.
    """

    def __init__(
        self,
        pipeline: str,
        policy: ResultsPolicy,
        emit_result: EmitResult,
        emit_event: EmitEvent,
        clock: Callable[[], float] = time.time,
        tracker: Tracker | None = None,
        outage: SourceOutage | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.policy = policy
        self._emit_result = emit_result
        self._emit_event = emit_event
        self._clock = clock
        self._tracker = tracker or Tracker()
        self._outage = outage
        self._objects: dict[int, _Object] = {}
        self._last_ts = 0.0
        self.model: str | None = None
        """The model that produced the latest frame (the new one once a swap landed)."""
        self.results = 0
        self.events = 0

    def emit(self, result: FrameResult) -> None:
        now = self._clock()
        for event in result.events:
            if event.kind in _RUN_ENDS:
                continue
            kind = _EVENT_KIND.get(event.kind, "rule")
            detail = event.detail or ""
            if kind == "rule":
                detail = (
                    f"{event.kind}: {event.label} ({event.rule})" if event.label else event.kind
                )
            if kind == "source_lost" and self._outage is not None:
                self._outage.lost(event.code)
            self._send(
                AgentEvent.model_validate(
                    {
                        "kind": kind,
                        "ts": now,
                        "pipeline": self.pipeline,
                        "model": result.model,
                        # A failure event without its code broke the protocol's promise
                        # that every failure event carries one (source_lost did).
                        "code": event.code,
                        "detail": detail,
                    }
                )
            )
        if result.frame < 0:
            return
        self.model = result.model
        self._track(result, now)
        if self.policy == "events":
            return
        if self.policy == "detections" and not result.results:
            return
        body: list[dict[str, Any]] = [r.model_dump(mode="json") for r in result.results]
        self._emit_result(
            self.pipeline,
            ResultMessage(
                pipeline=self.pipeline,
                frame=result.frame,
                ts=now,
                stream_ts=result.ts,
                model=result.model,
                results=body,
                zones=None if result.zones is None else [list(z) for z in result.zones],
            ),
        )
        self.results += 1

    def _track(self, result: FrameResult, now: float) -> None:
        detections = [r for r in result.results if isinstance(r, Detection)]
        if not detections and not self._objects:
            return  # nothing tracked and nothing to track: a classifier, or an empty scene
        self._last_ts = result.ts
        # A track's box is the box of the detection it was matched to, and a box's zones
        # depend on the box alone: so the box finds the zones of a new or updated track.
        zones_at: dict[tuple[float, float, float, float], tuple[str, ...]] = {}
        if result.zones is not None:
            zones_at = {
                r.box: names
                for r, names in zip(result.results, result.zones, strict=True)
                if isinstance(r, Detection)
            }
        for change in self._tracker.update(result.ts, detections):
            self._on_track(change, now, zones_at.get(change.box, ()))

    def _on_track(self, change: TrackEvent, now: float, zones: tuple[str, ...]) -> None:
        seen = self._objects.get(change.id)
        if change.kind == "new" or seen is None:
            seen = self._objects[change.id] = _Object(
                event_id=f"{now:.3f}-{self.pipeline}-{change.id}",
                start_time=now,
                last_seen=now,
                best_score=change.score,
                updated_ts=change.ts,
                sent_box=change.box,
                sent_score=change.score,
                zones=zones,
                sent_zones=zones,
            )
            self._detection("new", change, seen)
            return
        if change.kind == "end":
            del self._objects[change.id]
            self._detection("end", change, seen, end_time=seen.last_seen)
            return
        seen.last_seen = now
        seen.best_score = max(seen.best_score, change.score)
        seen.zones = zones
        since = change.ts - seen.updated_ts
        rose = seen.best_score >= seen.sent_score + SCORE_RISE
        # Throttled like a move: feet on a zone's edge flip in and out from frame to frame.
        moved = since >= UPDATE_EVERY_S and (
            _moved(seen.sent_box, change.box) or zones != seen.sent_zones
        )
        if rose or moved or since >= HEARTBEAT_S:
            seen.updated_ts = change.ts
            seen.sent_box = change.box
            seen.sent_score = seen.best_score
            seen.sent_zones = zones
            self._detection("update", change, seen)

    def _detection(
        self,
        kind: Literal["new", "update", "end"],
        change: TrackEvent,
        seen: _Object,
        end_time: float | None = None,
    ) -> None:
        x0, y0, x1, y1 = (round(v, 1) for v in change.box)
        self._send(
            DetectionEvent(
                type=kind,
                id=seen.event_id,
                pipeline=self.pipeline,
                label=change.label,
                score=round(seen.best_score, 4),
                box=(x0, y0, x1, y1),
                start_time=seen.start_time,
                end_time=end_time,
                zones=list(seen.zones),
            )
        )

    def _send(self, event: AgentEvent | DetectionEvent) -> None:
        self._emit_event(event)
        self.events += 1

    def close(self) -> None:
        """End every object still tracked: the pipeline stopped or its source ended."""
        for change in self._tracker.flush(self._last_ts):
            seen = self._objects.pop(change.id, None)
            if seen is not None:
                self._detection("end", change, seen, end_time=seen.last_seen)
