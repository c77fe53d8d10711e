"""Occupancy per pipeline and label: is an object of that label there right now?

Pure: fed tracked-object events (Frigate's new/update/end), the labels a frame's
results hold, and the time; it answers with the changes, never a clock of its
own. A label is present while a track of it is open, or while results showed it
less than `hold_s` ago (results stop when the scene is empty, under the default
results policy, so absence is a time-out, not a message).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Key = tuple[str, str]
"""(pipeline, label)."""


@dataclass(frozen=True, slots=True)
class Change:
    """Occupancy of one pipeline and label flipped."""

    pipeline: str
    label: str
    occupied: bool


def present_labels(results: Sequence[Mapping[str, Any]], min_score: float) -> set[str]:
    """Labels a frame's results (as published) show: detections at or above `min_score`,
    the top class of a classification, and "speech" for a speech segment."""
    labels: set[str] = set()
    top: Mapping[str, Any] | None = None
    for result in results:
        kind = result.get("kind")
        score = float(result.get("score", 1.0))
        if kind == "detection" and score >= min_score:
            labels.add(str(result.get("label")))
        elif kind == "class" and (top is None or score > float(top.get("score", 0.0))):
            top = result
        elif kind == "speech":
            labels.add("speech")
    if top is not None and float(top.get("score", 0.0)) >= min_score:
        labels.add(str(top.get("label")))
    return labels


class Occupancy:
    """Which watched (pipeline, label) pairs are occupied.

    Args:
        hold_s: How long a label seen in results keeps the pair occupied.
    """

    def __init__(self, hold_s: float) -> None:
        self.hold_s = hold_s
        self._watched: dict[str, frozenset[str]] = {}
        self._tracks: dict[Key, set[str]] = {}
        self._seen_at: dict[Key, float] = {}
        self._on: set[Key] = set()

    def watch(self, pipeline: str, labels: Iterable[str]) -> list[Change]:
        """Start (or re-start) watching a pipeline's labels; every pair starts unoccupied.

        Returns:
            One unoccupied change per newly watched pair, so its state is known at once.
        """
        before = self._watched.get(pipeline, frozenset())
        now_watched = frozenset(labels)
        for label in before - now_watched:
            self._drop((pipeline, label))
        self._watched[pipeline] = now_watched
        return [Change(pipeline, label, False) for label in sorted(now_watched - before)]

    def forget(self, pipeline: str) -> list[str]:
        """Stop watching a pipeline; returns the labels it had."""
        labels = self._watched.pop(pipeline, frozenset())
        for label in labels:
            self._drop((pipeline, label))
        return sorted(labels)

    def labels(self, pipeline: str) -> list[str]:
        """The labels watched on `pipeline`."""
        return sorted(self._watched.get(pipeline, ()))

    def occupied(self, pipeline: str, label: str) -> bool:
        """Current state of one pair (as last reported)."""
        return (pipeline, label) in self._on

    def seen(self, pipeline: str, labels: Iterable[str], now: float) -> list[Change]:
        """A frame of `pipeline` showed `labels` at `now`."""
        watched = self._watched.get(pipeline, frozenset())
        for label in watched.intersection(labels):
            self._seen_at[(pipeline, label)] = now
        return self._settle([(pipeline, label) for label in sorted(watched)], now)

    def track(
        self, pipeline: str, label: str, track_id: str, phase: str, now: float
    ) -> list[Change]:
        """A tracked object's event: phase new or update opens it, end closes it."""
        key = (pipeline, label)
        if label not in self._watched.get(pipeline, frozenset()):
            return []
        tracks = self._tracks.setdefault(key, set())
        if phase == "end":
            tracks.discard(track_id)
        else:
            tracks.add(track_id)
        return self._settle([key], now)

    def lost(self, pipeline: str, now: float) -> list[Change]:
        """The pipeline's source or engine failed: its open tracks will get no end."""
        for label in self._watched.get(pipeline, ()):
            self._tracks.pop((pipeline, label), None)
        return self._settle([(pipeline, label) for label in self.labels(pipeline)], now)

    def expire(self, now: float) -> list[Change]:
        """Pairs whose results went quiet for `hold_s` turn unoccupied."""
        keys = [(p, label) for p, labels in self._watched.items() for label in sorted(labels)]
        return self._settle(keys, now)

    def _occupied_now(self, key: Key, now: float) -> bool:
        if self._tracks.get(key):
            return True
        seen = self._seen_at.get(key)
        return seen is not None and now - seen <= self.hold_s

    def _settle(self, keys: Iterable[Key], now: float) -> list[Change]:
        changes = []
        for key in keys:
            occupied = self._occupied_now(key, now)
            if occupied != (key in self._on):
                if occupied:
                    self._on.add(key)
                else:
                    self._on.discard(key)
                changes.append(Change(key[0], key[1], occupied))
        return changes

    def _drop(self, key: Key) -> None:
        self._tracks.pop(key, None)
        self._seen_at.pop(key, None)
        self._on.discard(key)
