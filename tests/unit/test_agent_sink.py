"""The agent's sink: the results policy, and Frigate-shaped detection events from tracks."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pytest
from pydantic import ValidationError

from edge_agent.agent.outage import SourceOutage
from edge_agent.agent.sink import (
    HEARTBEAT_S,
    UPDATE_EVERY_S,
    AgentSink,
    ResultsPolicy,
    event_priority,
)
from edge_agent.heads.base import Classification, Detection, Result
from edge_agent.outbox import Priority
from edge_agent.pipelines.base import Event, FrameResult
from edge_agent.protocol.agent import AgentEvent, DetectionEvent, EventMessage, ResultMessage
from edge_agent.vision.zones import Scene, Zone

FPS = 10.0
T0 = 1_700_000_000.0


class _Out:
    def __init__(self) -> None:
        self.results: list[ResultMessage] = []
        self.events: list[AgentEvent | DetectionEvent] = []
        self.now = T0

    def sink(self, policy: ResultsPolicy = "detections") -> AgentSink:
        return AgentSink(
            "dock", policy, lambda _p, r: self.results.append(r), self.events.append, self.clock
        )

    def clock(self) -> float:
        return self.now

    def detections(self) -> list[DetectionEvent]:
        return [e for e in self.events if isinstance(e, DetectionEvent)]


def person(x: float, score: float = 0.8) -> Detection:
    return Detection(label="person", class_id=1, score=score, box=(x, 100, x + 80, 300))


def frame(index: int, results: list[Result], events: list[Event] | None = None) -> FrameResult:
    return FrameResult("dock", index, index / FPS, results, events or [], {}, "person-det")


def feed(out: _Out, sink: AgentSink, frames: Sequence[Sequence[Result]]) -> None:
    for index, results in enumerate(frames):
        out.now = T0 + index / FPS
        sink.emit(frame(index, list(results)))


@pytest.mark.parametrize(
    ("policy", "published"),
    [("all", [0, 1, 2, 3]), ("detections", [1, 2]), ("events", [])],
)
def test_results_policy_decides_which_frames_are_published(
    policy: ResultsPolicy, published: list[int]
) -> None:
    out = _Out()
    sink = out.sink(policy)
    feed(out, sink, [[], [person(10)], [person(12)], []])
    assert [r.frame for r in out.results] == published
    # The policy limits results, never events: the object is reported whatever it is.
    assert [e.type for e in out.detections()] == ["new"]


def test_a_walker_gives_new_throttled_updates_and_end_in_frigate_shape() -> None:
    out = _Out()
    sink = out.sink("events")
    seen = 40  # 4 s at 10 fps, walking right, score steady
    feed(out, sink, [[person(10 + 5 * i)] for i in range(seen)] + [[] for _ in range(30)])
    events = out.detections()
    kinds = [e.type for e in events]
    assert kinds[0] == "new"
    assert kinds[-1] == "end"
    assert kinds.count("new") == 1
    assert kinds.count("end") == 1
    # One update per second of stream time while nothing changes, not one per frame.
    assert kinds.count("update") == pytest.approx((seen - 1) / FPS / UPDATE_EVERY_S, abs=1)
    assert len({e.id for e in events}) == 1
    first, last = events[0], events[-1]
    assert first.start_time == T0
    assert first.end_time is None
    assert last.start_time == T0
    assert last.end_time == pytest.approx(T0 + (seen - 1) / FPS)  # last seen, not noticed gone
    assert last.box[0] == pytest.approx(10 + 5 * (seen - 1))
    assert all(e.label == "person" and e.pipeline == "dock" for e in events)
    # Every event goes on the wire in the documented envelope.
    for event in events:
        EventMessage(device_id="dev", event=event)


def test_a_rising_score_is_reported_at_once_as_the_best_score() -> None:
    out = _Out()
    sink = out.sink()
    feed(out, sink, [[person(10, 0.6)], [person(11, 0.9)], [person(12, 0.7)]])
    events = out.detections()
    assert [(e.type, e.score) for e in events] == [("new", 0.6), ("update", 0.9)]


def test_parked_objects_send_a_heartbeat_a_minute_and_a_moved_one_an_update() -> None:
    out = _Out()
    sink = out.sink("events")
    fps = 5.0
    # 50 parked cars in a 10 x 5 grid, their boxes jittering by a pixel as a model's do.
    parked = [(60.0 + 120 * (i % 10), 60.0 + 120 * (i // 10)) for i in range(50)]
    seconds = HEARTBEAT_S + 5
    frames = int(seconds * fps)
    for index in range(frames):
        ts = index / fps
        out.now = T0 + ts
        jitter = (index % 3) - 1
        cars = [
            Detection(label="car", class_id=3, score=0.8, box=(x + jitter, y, x + 100, y + 90))
            for x, y in parked
        ]
        # One van drives off, 40 px a second, from the 20th second on.
        drive = 40 * max(0.0, ts - 20)
        van = Detection(label="van", class_id=4, score=0.8, box=(60 + drive, 700, 260 + drive, 800))
        sink.emit(FrameResult("dock", index, ts, [*cars, van], [], {}, "cars"))
    events = out.detections()
    cars_events = [e for e in events if e.label == "car"]
    assert sum(e.type == "new" for e in cars_events) == 50
    updates: dict[str, int] = {}
    for event in cars_events:
        if event.type == "update":
            updates[event.id] = updates.get(event.id, 0) + 1
    # At most one heartbeat each in a minute, not one update a second (3,000 of them).
    assert len(cars_events) <= 100
    assert all(count == 1 for count in updates.values())
    van_updates = [e for e in events if e.label == "van" and e.type == "update"]
    # It moved: updates while it drives (not once a frame), none in the 20 s it stood still.
    assert 3 <= len(van_updates) <= seconds - 20 + 1
    assert van_updates[0].box[0] > 60
    assert all(event_priority(e) == Priority.RESULT for e in van_updates)
    assert event_priority(events[0]) == Priority.CRITICAL  # a `new` is never dropped
    sink.close()
    assert {event_priority(e) for e in out.detections() if e.type == "end"} == {Priority.CRITICAL}


def test_an_object_stepping_into_a_zone_says_so_within_a_second() -> None:
    out = _Out()
    sink = out.sink("all")
    dock = Zone(name="dock", points=((54.75, 0), (640, 0), (640, 480), (54.75, 480)))
    scene = Scene((640, 480), [dock])
    # Half a pixel a frame: feet (x + 40) cross x=54.75 at frame 10, too slow a move to
    # report (IoU with the box sent stays above 0.8), and the score is steady.
    for index in range(20):
        out.now = T0 + index / FPS
        results: list[Result] = [person(10 + 0.5 * index)]
        zones = scene.zones_of_results(results)
        sink.emit(FrameResult("dock", index, index / FPS, results, [], {}, "m", zones=zones))
    # The update comes as the feet cross (box at x=15), not when the box has moved (x=19).
    assert [(e.type, e.box[0], e.zones) for e in out.detections()] == [
        ("new", 10.0, []),
        ("update", 15.0, ["dock"]),
    ]
    assert [r.zones for r in out.results[9:12]] == [[[]], [["dock"]], [["dock"]]]
    sink.close()
    assert [(e.type, e.zones) for e in out.detections()][-1] == ("end", ["dock"])


def test_a_pipeline_without_zones_sends_no_zones_with_its_results() -> None:
    out = _Out()
    feed(out, out.sink("all"), [[person(10)]])
    [result] = out.results
    assert result.zones is None
    assert "zones" not in result.model_dump_json(exclude_none=True)
    assert [e.zones for e in out.detections()] == [[]]
    with pytest.raises(ValidationError, match="one per result"):
        ResultMessage.model_validate({**result.model_dump(), "zones": [["dock"], []]})


def test_close_ends_objects_still_in_view() -> None:
    out = _Out()
    sink = out.sink()
    feed(out, sink, [[person(10), person(400)], [person(12), person(402)]])
    sink.close()
    ends = [e for e in out.detections() if e.type == "end"]
    assert len(ends) == 2
    assert all(e.end_time == T0 + 1 / FPS for e in ends)


def test_a_classifier_makes_no_detection_events() -> None:
    out = _Out()
    sink = out.sink("all")
    cls = Classification(label="0", class_id=0, score=0.9)
    feed(out, sink, [[cls], [cls]])
    sink.close()
    assert out.detections() == []
    assert [r.frame for r in out.results] == [0, 1]


def test_pipeline_events_become_agent_events() -> None:
    out = _Out()
    sink = out.sink()
    lost = Event(kind="source_error", ts=1.0, detail="camera gone", code="source.failed")
    swapped = Event(kind="model_swapped", ts=1.0, detail="person-ssdlite")
    rule = Event(kind="appeared", rule="someone", label="person", ts=1.0)
    # Said by the agent itself as pipeline_failed when the run ends: not twice.
    failed = Event(kind="pipeline_error", ts=1.0, detail="engine", code="inference.failed")
    sink.emit(FrameResult("dock", -1, 1.0, [], [lost, swapped, rule, failed], {}, "m"))
    agent = [e for e in out.events if isinstance(e, AgentEvent)]
    # A failure event carries its code, as docs/PROTOCOL.md promises; the others have none.
    assert [(e.kind, e.detail, e.code) for e in agent] == [
        ("source_lost", "camera gone", "source.failed"),
        ("model_swapped", "person-ssdlite", None),
        ("rule", "appeared: person (someone)", None),
    ]
    assert out.results == []


def test_the_sources_return_ends_the_outage_with_its_length_not_a_frame_in_flight(
    caplog: pytest.LogCaptureFixture,
) -> None:
    out = _Out()
    now = [100.0]
    outage = SourceOutage("dock", clock=lambda: now[0])
    sink = AgentSink(
        "dock", "events", lambda _p, r: None, out.events.append, out.clock, outage=outage
    )
    assert outage.live() is None  # never lost: nothing to recover from
    lost = Event(kind="source_reconnecting", ts=1.0, detail="gone", code="source.failed")
    sink.emit(FrameResult("dock", -1, 1.0, [], [lost], {}, "m"))
    # Frames the engine held at the loss come out after it: they were read before it, and
    # ended the outage at 0 s while the camera was still gone.
    sink.emit(frame(7, []))
    now[0] = 105.0
    sink.emit(FrameResult("dock", -1, 1.0, [], [lost], {}, "m"))  # lost again: same outage
    now[0] = 112.5
    # A retry's source going live (the handle calls it) ends the outage it shares.
    assert outage.live() == 12.5
    recovered = [r for r in caplog.records if getattr(r, "event", None) == "source_recovered"]
    assert [(r.levelno, r.fields) for r in recovered] == [  # type: ignore[attr-defined]
        (logging.WARNING, {"pipeline": "dock", "down_s": 12.5, "code": "source.failed"})
    ]
    assert outage.live() is None  # once only
    outage.lost("source.unreachable")
    now[0] = 113.0
    assert outage.live() == 0.5
    assert [e.kind for e in out.events if isinstance(e, AgentEvent)] == ["source_lost"] * 2
