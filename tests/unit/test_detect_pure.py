"""The pure parts of the `[detect]` wiring: results mapped back, zone rules, calls per frame."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from edge_agent.catalog.manifest import ImageInput
from edge_agent.heads.base import Classification, Detection, TextBox
from edge_agent.pipelines.base import Frame
from edge_agent.pipelines.detect import Detector
from edge_agent.pipelines.events import EventRule, EventTracker
from edge_agent.pipelines.sources import FileSourceSpec
from edge_agent.pipelines.spec import DetectSpec, ModelRef, PipelineSpec
from edge_agent.runtime.preprocess import input_geometry
from edge_agent.telemetry.stats import PipelineTelemetry
from edge_agent.vision.geometry import Geometry
from edge_agent.vision.mapping import to_frame
from edge_agent.vision.zones import Scene, Zone

PERSON = Detection(
    label="person", class_id=1, score=0.9, box=(100, 50, 200, 250), keypoints=((150, 100),)
)


def test_results_map_back_through_a_letterbox() -> None:
    # 1280x720 into 320x320: scale 0.25, the picture 320x180 at rows 70-250.
    g = Geometry.fit((1280, 720), (320, 320), "letterbox")
    text = TextBox(score=0.8, polygon=((0, 70), (320, 70), (320, 250), (0, 250)))
    top = Classification(label="x", class_id=0, score=0.5)
    person, box, label = to_frame([PERSON, text, top], g)
    assert isinstance(person, Detection)
    # The box reached 20 model px into the top padding: it ends at the picture's edge.
    assert person.box == pytest.approx((400, 0, 800, 720))
    assert person.keypoints[0] == pytest.approx((600, 120))
    assert isinstance(box, TextBox)
    assert [pytest.approx(p) for p in box.polygon] == [(0, 0), (1280, 0), (1280, 720), (0, 720)]
    assert label == top


def test_a_box_wholly_in_the_padding_is_dropped() -> None:
    g = Geometry.fit((1280, 720), (320, 320), "letterbox")
    ghost = PERSON.model_copy(update={"box": (10, 5, 50, 60)})
    assert to_frame([ghost], g) == []


def spec(**update: object) -> PipelineSpec:
    return PipelineSpec(
        id="cam", model=ModelRef(name="person-ssdlite"), source=FileSourceSpec(path=Path("x"))
    ).model_copy(update=update)


def test_a_rule_naming_an_unknown_zone_is_refused() -> None:
    rule = EventRule(name="r", label="person", zone="door")
    with pytest.raises(ValidationError, match="names zone 'door'; the zones are: none"):
        PipelineSpec.model_validate(spec(events=[rule]).model_dump())
    door = Zone(name="door", points=((0, 0), (1, 0), (1, 1)), units="fraction")
    with pytest.raises(ValidationError, match="zone names must be unique"):
        PipelineSpec.model_validate(spec(zones=[door, door]).model_dump())
    ok = PipelineSpec.model_validate(spec(zones=[door], events=[rule]).model_dump())
    assert ok.events[0].zone == "door"
    assert ok.detect == DetectSpec()


def test_a_zone_rule_sees_only_the_detections_with_feet_in_its_zone() -> None:
    floor = Zone(name="floor", points=((0, 200), (400, 200), (400, 300), (0, 300)))
    scene = Scene((400, 300), [floor])
    tracker = EventTracker([EventRule(name="floor", label="person", zone="floor")])
    # Box spans the zone's top edge, feet (y=190) above it: not in the zone.
    high = PERSON.model_copy(update={"box": (100, 100, 200, 190)})
    assert tracker.update(0.0, [high], scene.zones_of_results([high])) == []
    low = PERSON.model_copy(update={"box": (100, 150, 200, 250)})
    [event] = tracker.update(0.1, [low], scene.zones_of_results([low]))
    assert (event.kind, event.rule) == ("appeared", "floor")


def test_calls_per_frame_is_the_mean_over_the_run_and_the_interval() -> None:
    now = [0.0]
    telemetry = PipelineTelemetry("cam", clock=lambda: now[0])
    telemetry.mode = "regions"
    for calls in (15, 0, 0, 1):
        telemetry.frame_done(calls)
    first = telemetry.interval()
    assert (first.mode, first.calls_per_frame) == ("regions", 4.0)
    telemetry.frame_done(2)
    assert telemetry.interval().calls_per_frame == 2.0
    assert telemetry.snapshot().calls_per_frame == pytest.approx(18 / 5)


def test_pixel_zones_are_camera_pixels_on_a_reduced_decode() -> None:
    # A 1280x720 camera decoded at 1/2: the zone drawn at camera rows 600-720 is rows 300-360.
    image = ImageInput(
        name="x", shape=(1, 300, 300, 3), layout="NHWC", element_type="u8", color="RGB"
    )
    floor = Zone(name="floor", points=((0, 600), (1280, 600), (1280, 720), (0, 720)))
    detector = Detector(zones=[floor])
    frame = Frame(0, 0.0, np.zeros((360, 640, 3), np.uint8), 0.0, scale=2)
    [geometry] = detector.plan(frame, image)
    # Feet at model row 290 of 300: frame row 348 of the 360-row decode.
    person = PERSON.model_copy(update={"box": (100, 200, 150, 290), "keypoints": ()})
    results, zones = detector.combine(frame, image, [(geometry, [person])])
    assert len(results) == 1
    assert zones == [("floor",)]
    # What leaves the Detector is in the camera's pixels: twice the decoded frame's.
    [decoded] = to_frame([person], geometry)
    assert isinstance(decoded, Detection)
    assert isinstance(results[0], Detection)
    assert results[0].box == pytest.approx(tuple(2 * v for v in decoded.box))
    assert results[0].box[3] > 600, "the feet are at camera row ~700, in the zone"


def test_a_zone_wholly_outside_the_frame_is_warned_about_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    image = ImageInput(
        name="x", shape=(1, 300, 300, 3), layout="NHWC", element_type="u8", color="RGB"
    )
    # Drawn on a 1920x1080 camera's picture, run on a 1280x720 one.
    far = Zone(name="far", points=((1400, 800), (1900, 800), (1900, 1000), (1400, 1000)))
    near = Zone(name="near", points=((0, 600), (1280, 600), (1280, 720), (0, 720)))
    detector = Detector(zones=[far, near])
    for index in range(3):
        frame = Frame(index, index / 10, np.zeros((720, 1280, 3), np.uint8), 0.0)
        [geometry] = detector.plan(frame, image)
        detector.combine(frame, image, [(geometry, [])])
    warned = [r for r in caplog.records if getattr(r, "event", None) == "zone_outside_frame"]
    assert [(r.levelname, getattr(r, "fields", {})) for r in warned] == [
        ("WARNING", {"kind": "zone", "name": "far", "frame": "1280x720"})
    ]


def test_a_whole_frame_plan_follows_the_frame_size_and_the_model() -> None:
    """Mode "frame" keeps its last geometry; a new frame size or a swapped model's input
    (equal or not) each get their own, as `input_geometry` gives them."""
    image = ImageInput(
        name="x", shape=(1, 300, 300, 3), layout="NHWC", element_type="u8", color="RGB"
    )
    detector = Detector()
    vga = Frame(0, 0.0, np.zeros((480, 640, 3), np.uint8), 0.0)
    hd = Frame(1, 0.1, np.zeros((720, 1280, 3), np.uint8), 0.0)
    [first] = detector.plan(vga, image)
    [again] = detector.plan(vga, image)
    assert again is first
    assert first == input_geometry(image, (640, 480))
    [wide] = detector.plan(hd, image)
    assert wide == input_geometry(image, (1280, 720))
    assert detector.plan(vga, image) == [first]
    letterbox = image.model_copy(update={"fit": "letterbox"})
    [boxed] = detector.plan(vga, letterbox)
    assert boxed == input_geometry(letterbox, (640, 480))
    assert boxed != first
    [same] = detector.plan(vga, image.model_copy())
    assert same == first


def test_min_size_asks_the_source_for_what_the_mode_needs() -> None:
    image = ImageInput(
        name="x", shape=(1, 300, 300, 3), layout="NHWC", element_type="u8", color="RGB"
    )
    full = (2048, 1536)
    assert Detector().min_size(image)(full) == (300, 300)  # stretch: the input itself
    letterbox = image.model_copy(update={"fit": "letterbox"})
    assert Detector().min_size(letterbox)(full) == (300, 225)
    # Tiles of half the frame's height (768 px) fed at 300 px: the frame at 300/768.
    tiles = Detector(DetectSpec(mode="tiles"))
    assert tiles.min_size(image)(full) == (800, 600)
    assert Detector(DetectSpec(mode="regions", tile=512)).min_size(image)(full) == (1200, 900)
