"""Event rules on scripted frame sequences, in stream time."""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from pydantic import ValidationError

from edge_agent.heads.base import Classification, Detection, Result, SpeechSegment, TextBox
from edge_agent.pipelines.base import Event
from edge_agent.pipelines.events import STREAM_ENDED, EventRule, EventTracker, label_scores

FPS = 10


def person(score: float = 0.9) -> Detection:
    return Detection(label="person", class_id=0, score=score, box=(10, 10, 50, 90))


def run(
    tracker: EventTracker, present: Iterable[int], n_frames: int, score: float = 0.9
) -> list[Event]:
    """Frames 0..n_frames-1 at 10 fps, with a person in the frames listed in `present`."""
    shown = set(present)
    events: list[Event] = []
    for frame in range(n_frames):
        results: list[Result] = [person(score)] if frame in shown else []
        events += tracker.update(frame / FPS, results)
    return events


def test_presence_fires_one_appeared_and_one_gone_at_the_right_time() -> None:
    tracker = EventTracker([EventRule(name="people", label="person", gone_after_s=5.0)])
    # Present in frames 10..40, with frames 20..29 (1 s) missing: shorter than gone_after_s.
    present = [f for f in range(10, 41) if not 20 <= f < 30]
    events = run(tracker, present, 200)
    assert events == [
        Event(kind="appeared", rule="people", label="person", ts=1.0),
        # Last seen at 4.0 s; gone once absent for 5 s.
        Event(kind="gone", rule="people", label="person", ts=9.0),
    ]


def test_a_gap_just_shorter_than_gone_after_s_fires_nothing() -> None:
    tracker = EventTracker([EventRule(name="people", label="person", gone_after_s=2.0)])
    # Last seen at 1.0, back at 2.9: absent 1.9 s.
    events = run(tracker, [*range(10, 11), *range(29, 40)], 40)
    assert [e.kind for e in events] == ["appeared"]


def test_debounce_ignores_a_one_frame_blip() -> None:
    tracker = EventTracker(
        [EventRule(name="people", label="person", appear_frames=3, gone_after_s=1.0)]
    )
    events = run(tracker, [5, 7, 8, *range(20, 23)], 60)
    assert events == [
        # Frames 5 and 7-8 never make three in a row; 20-22 do, on frame 22.
        Event(kind="appeared", rule="people", label="person", ts=2.2),
        Event(kind="gone", rule="people", label="person", ts=3.2),
    ]


def test_low_scores_do_not_count() -> None:
    tracker = EventTracker([EventRule(name="people", label="person", min_score=0.5)])
    assert run(tracker, range(10), 10, score=0.4) == []
    assert run(tracker, range(10), 10, score=0.5)[0].kind == "appeared"


def test_rules_are_independent_and_in_order() -> None:
    rules = [
        EventRule(name="fast", label="person", gone_after_s=0.5),
        EventRule(name="slow", label="person", appear_frames=5, gone_after_s=2.0),
    ]
    events = run(EventTracker(rules), range(10), 50)
    assert [(e.rule, e.kind, e.ts) for e in events] == [
        ("fast", "appeared", 0.0),
        ("slow", "appeared", 0.4),
        ("fast", "gone", 1.4),
        ("slow", "gone", 2.9),
    ]


def test_flush_closes_every_open_presence_and_says_why() -> None:
    rules = [
        EventRule(name="people", label="person", gone_after_s=1.0),
        EventRule(name="cars", label="car", gone_after_s=1.0),
        EventRule(name="bikes", label="bike", gone_after_s=1.0),
    ]
    tracker = EventTracker(rules)
    car = Detection(label="car", class_id=2, score=0.8, box=(0, 0, 5, 5))
    tracker.update(0.0, [person(), car])
    tracker.update(0.1, [car])
    # The person left and stayed away long enough: an ordinary "gone". The car is
    # still in view: a "gone" that says the stream ended, so "appeared" is never
    # left open. No bike ever appeared, so none is gone.
    assert tracker.flush(5.0) == [
        Event(kind="gone", rule="people", label="person", ts=5.0),
        Event(kind="gone", rule="cars", label="car", ts=5.0, detail=STREAM_ENDED),
    ]
    # Flush resets: the next stream starts from nothing.
    assert [e.kind for e in tracker.update(0.0, [car])] == ["appeared"]


def test_flush_inside_the_absence_window_closes_with_stream_ended() -> None:
    tracker = EventTracker([EventRule(name="people", label="person", gone_after_s=5.0)])
    tracker.update(0.0, [person()])
    tracker.update(0.1, [])
    assert tracker.flush(1.0) == [
        Event(kind="gone", rule="people", label="person", ts=1.0, detail=STREAM_ENDED)
    ]


def test_flush_after_gone_adds_nothing() -> None:
    tracker = EventTracker([EventRule(name="people", label="person", gone_after_s=1.0)])
    assert [e.kind for e in run(tracker, range(5), 30)] == ["appeared", "gone"]
    assert tracker.flush(3.0) == []


def test_time_going_backwards_restarts_the_absence_clock() -> None:
    tracker = EventTracker([EventRule(name="people", label="person", gone_after_s=2.0)])
    tracker.update(100.0, [person()])
    assert tracker.update(0.0, []) == []
    assert tracker.update(1.0, []) == []
    assert [e.kind for e in tracker.update(2.0, [])] == ["gone"]


def test_label_scores_use_top_class_and_speech() -> None:
    results: list[Result] = [
        Classification(label="dog", class_id=1, score=0.3),
        Classification(label="cat", class_id=2, score=0.6),
        SpeechSegment(start=0.0, end=1.0),
        TextBox(score=0.9, polygon=((0, 0), (1, 0), (1, 1), (0, 1))),
        person(0.7),
        person(0.8),
    ]
    assert label_scores(results) == {"cat": 0.6, "speech": 1.0, "person": 0.8}


def test_classification_and_speech_fire_events() -> None:
    tracker = EventTracker(
        [
            EventRule(name="talk", label="speech", gone_after_s=0.0),
            EventRule(name="dog", label="dog", min_score=0.1),
        ]
    )
    runner_up: list[Result] = [
        Classification(label="cat", class_id=2, score=0.6),
        Classification(label="dog", class_id=1, score=0.3),
    ]
    assert tracker.update(0.0, runner_up) == []
    events = tracker.update(0.1, [SpeechSegment(start=0.0, end=0.1)])
    assert [(e.rule, e.kind) for e in events] == [("talk", "appeared")]
    assert [(e.rule, e.kind) for e in tracker.update(0.2, [])] == [("talk", "gone")]


def test_rule_rejects_bad_values() -> None:
    with pytest.raises(ValidationError):
        EventRule(name="x", label="person", appear_frames=0)
    with pytest.raises(ValidationError):
        EventRule.model_validate({"name": "x", "label": "person", "colour": "red"})
