"""Zones and masks: the feet decide, and a mask hides detections and motion."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from edge_agent.config_files import RECORDED
from edge_agent.heads.base import Detection, Result
from edge_agent.pipelines.base import Event
from edge_agent.pipelines.events import EventRule, EventTracker
from edge_agent.vision.zones import Mask, Scene, Zone, inside

FRAME = (1280, 720)
# The right half of the floor: feet must be below y=400 and right of x=640.
DOORWAY = Zone(
    name="doorway",
    points=((0.5, 400 / 720), (1.0, 400 / 720), (1.0, 1.0), (0.5, 1.0)),
    units="fraction",
)


def person(box: tuple[float, float, float, float]) -> Detection:
    return Detection(label="person", class_id=1, score=0.9, box=box)


def test_event_fires_only_for_a_person_whose_feet_are_in_the_zone() -> None:
    scene = Scene(FRAME, zones=[DOORWAY])
    tracker = EventTracker(
        [EventRule(name="at-door", label="person", zone="doorway", gone_after_s=1.0)]
    )
    # Frames 0-9: a tall person whose body crosses the zone but whose feet stand left of it.
    # Frames 10-19: the same person with the feet inside. Frames 20-39: nobody.
    outside = person((560.0, 100.0, 700.0, 500.0))
    within = person((700.0, 100.0, 840.0, 500.0))
    events: list[Event] = []
    for frame in range(40):
        ts = frame / 10
        seen: list[Result] = [outside] if frame < 10 else [within] if frame < 20 else []
        events += tracker.update(ts, seen, scene.zones_of_results(seen))
    assert [(e.kind, e.ts) for e in events] == [("appeared", 1.0), ("gone", 2.9)]


def test_zone_membership_uses_the_bottom_centre() -> None:
    scene = Scene(
        FRAME, zones=[DOORWAY, Zone(name="all", points=((0, 0), (1280, 0), (1280, 720), (0, 720)))]
    )
    boxes = [(600, 0, 700, 399), (600, 0, 700, 450), (500, 300, 700, 450)]
    assert scene.zones_of(boxes) == [("all",), ("doorway", "all"), ("all",)]
    assert scene.zone_bounds() == [(640, 400, 1280, 720), (0, 0, 1280, 720)]


def test_mask_hides_a_detection_and_its_motion() -> None:
    tv = Mask(name="tv", points=((100, 100), (400, 100), (400, 300), (100, 300)))
    scene = Scene(FRAME, masks=[tv])
    on_tv = person((150.0, 120.0, 250.0, 280.0))
    # Walking in front of the TV: the box overlaps it a lot, but the feet are below it.
    in_front = person((200.0, 150.0, 300.0, 500.0))
    text = Detection(label="cup", class_id=2, score=0.7, box=(120.0, 120.0, 130.0, 130.0))
    assert scene.unmasked([on_tv, in_front, text]) == [in_front]
    mask = scene.motion_mask((160, 90))
    assert mask is not None
    assert mask.shape == (90, 160)
    assert mask[25, 30] == 0
    assert mask[60, 100] == 255
    assert Scene(FRAME).motion_mask((160, 90)) is None


def test_unknown_zone_matches_nothing_and_specs_are_strict() -> None:
    rule = EventRule(name="garden", label="person", zone="garden")
    seen: list[Result] = [person((700, 0, 800, 500))]
    assert (
        EventTracker([rule]).update(0.0, seen, Scene(FRAME, [DOORWAY]).zones_of_results(seen)) == []
    )
    with pytest.raises(ValidationError):
        Zone(name="x", points=((0, 0), (1, 1)))
    with pytest.raises(ValidationError):
        Zone.model_validate({"name": "x", "points": [[0, 0], [1, 0], [1, 1]], "colour": "red"})


@given(
    st.floats(-50, 50),
    st.floats(-50, 50),
    st.floats(1, 40),
    st.floats(1, 40),
    st.lists(st.tuples(st.floats(-100, 100), st.floats(-100, 100)), min_size=1, max_size=30),
)
def test_inside_agrees_with_a_rectangle(
    x0: float, y0: float, w: float, h: float, points: list[tuple[float, float]]
) -> None:
    rect = np.array([[x0, y0], [x0 + w, y0], [x0 + w, y0 + h], [x0, y0 + h]])
    pts = np.asarray(points)
    got = inside(rect, pts)
    strict = (pts[:, 0] > x0) & (pts[:, 0] < x0 + w) & (pts[:, 1] > y0) & (pts[:, 1] < y0 + h)
    on_edge = (
        np.isclose(pts[:, 0], x0)
        | np.isclose(pts[:, 0], x0 + w)
        | np.isclose(pts[:, 1], y0)
        | np.isclose(pts[:, 1], y0 + h)
    )
    assert np.array_equal(got[~on_edge], strict[~on_edge])


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_corner_that_is_not_a_finite_number_is_refused(bad: float) -> None:
    # It was accepted, and every inside() test of the zone was then false (numpy warned
    # casting it): a zone that never fires, with the spec reading as fine.
    with pytest.raises(ValidationError, match="finite"):
        Zone(name="x", points=((bad, 0.1), (1, 0), (1, 1)))
    with pytest.raises(ValidationError, match="finite"):
        Mask.model_validate_json('{"points": [[0, 0], [1, 0], [1, NaN]]}')


def test_fractions_given_as_pixels_are_refused_naming_the_units() -> None:
    # Pixels are the default: this was a zone 1 px across in the corner, matching nothing.
    dock = {"name": "dock", "points": [[0.1, 0.6], [0.6, 0.6], [0.6, 1.0], [0.1, 1.0]]}
    with pytest.raises(ValidationError, match=r"zone 'dock'.*units = \"fraction\""):
        Zone.model_validate(dock)
    with pytest.raises(ValidationError, match=r'mask has every point.*units = "fraction"'):
        Mask.model_validate({"points": dock["points"]})
    assert Zone.model_validate({**dock, "units": "fraction"}).polygon((100, 100))[1, 0] == 60
    # A pixel zone near the corner is fine once any point is past the first pixel.
    Zone.model_validate({**dock, "points": [[0, 0], [2, 0], [2, 2]]})


def test_a_recorded_zone_in_fractions_as_pixels_is_kept_and_warned_of_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # An earlier build's record: kept as it served, and said once a process, though a
    # restore reads the record more than once (and a retried camera, or calibration, again).
    points = [[0.2, 0.6], [0.7, 0.6], [0.7, 0.9], [0.2, 0.9]]
    caplog.set_level(logging.WARNING, logger="edge_agent.vision.zones")
    for _ in range(3):
        zone = Zone.model_validate({"name": "kept", "points": points}, context={RECORDED: True})
        assert zone.units == "px"
    other = {"name": "other", "points": points}
    Zone.model_validate(other, context={RECORDED: True})
    said = [vars(r)["fields"]["name"] for r in caplog.records if "fractions" in r.getMessage()]
    assert said == ["kept", "other"]
