"""Event rules: turn per-frame results into "appeared" and "gone" events.

Pure: the tracker sees stream timestamps and results, never a clock, so a
file gives the same events on every run and tests can script a sequence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from edge_agent.heads.base import Classification, Detection, Result, SpeechSegment
from edge_agent.pipelines.base import Event

# Timestamps are float sums of frame periods (0.1 + 0.2 != 0.3); without
# slack, an absence of exactly `gone_after_s` would fire one frame late.
_TS_SLACK = 1e-9

SPEECH_LABEL = "speech"

STREAM_ENDED = "stream ended"
"""Detail of a "gone" fired because the stream ended with the label still present."""


class EventRule(BaseModel):
    """Fire "appeared" when a label comes into view and "gone" when it has left."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, description="Rule name, copied into its events.")
    label: str = Field(
        min_length=1,
        description='Label to watch, e.g. "person"; "speech" for speech segments.',
    )
    min_score: float = Field(
        default=0.5, ge=0.0, le=1.0, description="Results scoring below this are ignored."
    )
    appear_frames: int = Field(
        default=1,
        ge=1,
        description='Consecutive frames with the label before "appeared" fires (debounce).',
    )
    gone_after_s: float = Field(
        default=5.0,
        ge=0.0,
        description='Stream seconds without the label before "gone" fires.',
    )
    zone: str | None = Field(
        default=None,
        description="Only detections whose bottom centre is in this [[zones]] entry count.",
    )


def label_scores(results: Sequence[Result]) -> dict[str, float]:
    """Best score per label in one frame's results.

    Detections count by their label; classifications by the top-1 class only
    (the runners-up are what the model thinks it is *not*); a speech segment
    counts as label "speech" with score 1.0. Other results carry no label.
    """
    scores: dict[str, float] = {}
    top_class: Classification | None = None
    for result in results:
        if isinstance(result, Detection):
            scores[result.label] = max(scores.get(result.label, 0.0), result.score)
        elif isinstance(result, Classification):
            if top_class is None or result.score > top_class.score:
                top_class = result
        elif isinstance(result, SpeechSegment):
            scores[SPEECH_LABEL] = 1.0
    if top_class is not None:
        scores[top_class.label] = max(scores.get(top_class.label, 0.0), top_class.score)
    return scores


def _in_zone(
    results: Sequence[Result], zones: Sequence[Sequence[str]] | None, zone: str
) -> list[Result]:
    if zones is None:
        return []
    return [r for r, names in zip(results, zones, strict=True) if zone in names]


@dataclass(slots=True)
class _RuleState:
    present: bool = False
    streak: int = 0
    """Consecutive frames, up to now, with the label."""
    last_seen: float | None = None
    """Stream time the label was last in a frame."""


class EventTracker:
    """Per-rule state across frames; one tracker per stream.

    Args:
        rules: The rules to evaluate on every frame.
    """

    def __init__(self, rules: Sequence[EventRule]) -> None:
        self.rules = tuple(rules)
        self._states = [_RuleState() for _ in self.rules]
        self._last_ts: float | None = None

    def update(
        self,
        ts: float,
        results: Sequence[Result],
        zones: Sequence[Sequence[str]] | None = None,
    ) -> list[Event]:
        """Feed one frame's results.

        Args:
            ts: Stream time of the frame, in seconds.
            results: What the head found in it.
            zones: Per result, the names of the zones it is in (`Detector.combine`); a
                rule naming a zone sees only the results in it (none without `zones`).

        Returns:
            Events fired by this frame, in rule order.
        """
        if self._last_ts is not None and ts < self._last_ts:
            # Time went backwards (a live source reopened and restarted its
            # clock): restart absence clocks rather than wait for time to catch up.
            for state in self._states:
                if state.last_seen is not None:
                    state.last_seen = ts
        self._last_ts = ts
        scores = label_scores(results)
        events: list[Event] = []
        for rule, state in zip(self.rules, self._states, strict=True):
            seen = (
                scores if rule.zone is None else label_scores(_in_zone(results, zones, rule.zone))
            )
            if seen.get(rule.label, -1.0) >= rule.min_score:
                state.streak += 1
                state.last_seen = ts
                if not state.present and state.streak >= rule.appear_frames:
                    state.present = True
                    events.append(Event(kind="appeared", rule=rule.name, label=rule.label, ts=ts))
            else:
                state.streak = 0
                events.extend(self._check_gone(rule, state, ts))
        return events

    def flush(self, ts: float) -> list[Event]:
        """End of stream at `ts`: close every open presence with a "gone", then reset.

        A label that left and stayed away for `gone_after_s` by `ts` gets its
        ordinary "gone", though no frame came after to notice it. A label still
        in view (or not away long enough) gets a "gone" with detail
        `STREAM_ENDED`: the record then pairs every "appeared" with a "gone", so
        whoever counts presence (a dashboard, the fleet's state) never keeps an
        object present forever after its camera stopped, and the detail says
        the observation ended rather than that the object left.

        Returns:
            The "gone" events, in rule order.
        """
        events: list[Event] = []
        for rule, state in zip(self.rules, self._states, strict=True):
            left = self._check_gone(rule, state, ts) if state.streak == 0 else []
            if not left and state.present:
                left = [
                    Event(kind="gone", rule=rule.name, label=rule.label, ts=ts, detail=STREAM_ENDED)
                ]
            events.extend(left)
        self._states = [_RuleState() for _ in self.rules]
        self._last_ts = None
        return events

    @staticmethod
    def _check_gone(rule: EventRule, state: _RuleState, ts: float) -> list[Event]:
        if (
            state.present
            and state.last_seen is not None
            and ts - state.last_seen >= rule.gone_after_s - _TS_SLACK
        ):
            state.present = False
            return [Event(kind="gone", rule=rule.name, label=rule.label, ts=ts)]
        return []
