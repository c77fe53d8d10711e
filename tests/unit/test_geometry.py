"""Geometry: the frame-to-model transform, its inverse, and the pixels it writes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edge_agent.errors import EdgeAgentError
from edge_agent.heads.base import Detection, TextBox
from edge_agent.heads.blazeface import BlazeFaceConfig, decode_blazeface
from edge_agent.heads.dbnet import DbnetConfig, decode_dbnet
from edge_agent.heads.ssd import SsdConfig, decode_ssd
from edge_agent.vision.geometry import Fit, Geometry
from edge_agent.vision.mapping import to_frame

FITS: tuple[Fit, ...] = ("letterbox", "stretch", "crop")
MODELS = [(300, 300), (640, 640), (320, 192), (224, 224), (192, 320)]


@st.composite
def frames(draw: st.DrawFn) -> tuple[int, int]:
    """Frame sizes of aspect 0.25 to 4."""
    height = draw(st.integers(40, 1200))
    aspect = draw(st.floats(0.25, 4.0))
    return max(10, round(height * aspect)), height


@st.composite
def cases(draw: st.DrawFn) -> tuple[Geometry, tuple[float, float, float, float]]:
    frame = draw(frames())
    model = draw(st.sampled_from(MODELS))
    fit = draw(st.sampled_from(FITS))
    crop = None
    if draw(st.booleans()):
        x0 = draw(st.integers(-50, frame[0] - 5))
        y0 = draw(st.integers(-50, frame[1] - 5))
        crop = (x0, y0, x0 + draw(st.integers(5, 2000)), y0 + draw(st.integers(5, 2000)))
    geometry = Geometry.fit(frame, model, fit, crop=crop)
    s = geometry.source
    fx = sorted(draw(st.floats(0, 1)) for _ in range(2))
    fy = sorted(draw(st.floats(0, 1)) for _ in range(2))
    w, h = s[2] - s[0], s[3] - s[1]
    box = (s[0] + fx[0] * w, s[1] + fy[0] * h, s[0] + fx[1] * w, s[1] + fy[1] * h)
    return geometry, box


@settings(max_examples=300, deadline=None)
@given(cases())
def test_boxes_round_trip(case: tuple[Geometry, tuple[float, float, float, float]]) -> None:
    geometry, box = case
    model = geometry.to_model(box)
    back = geometry.to_frame(model)
    np.testing.assert_allclose(back[0], box, atol=1e-6)
    # Inside the picture, never in the padding, never off the input.
    t = geometry.target
    assert np.all(model[0, [0, 2]] >= t[0] - 1e-6)
    assert np.all(model[0, [0, 2]] <= t[2] + 1e-6)
    assert np.all(model[0, [1, 3]] >= t[1] - 1e-6)
    assert np.all(model[0, [1, 3]] <= t[3] + 1e-6)


@settings(max_examples=300, deadline=None)
@given(
    cases(),
    st.lists(st.floats(-400.0, 1000.0, allow_nan=False), min_size=4, max_size=4),
)
def test_one_box_maps_as_the_array_path_does(
    case: tuple[Geometry, tuple[float, float, float, float]], coords: list[float]
) -> None:
    """`box_to_frame` is `to_frame(box)[0]` to the last bit, inside the picture and out
    (clipped), so the emitter's plain-Python path reports the boxes the array path would."""
    geometry, _ = case
    box = (coords[0], coords[1], coords[2], coords[3])
    got = geometry.box_to_frame(box)
    want = geometry.to_frame(box)[0]
    assert all(isinstance(v, float) for v in got)
    assert got == tuple(want.tolist())


@settings(max_examples=200, deadline=None)
@given(frames(), st.sampled_from(MODELS), st.sampled_from(FITS))
def test_aspect_kept_unless_stretched(
    frame: tuple[int, int], model: tuple[int, int], fit: Fit
) -> None:
    geometry = Geometry.fit(frame, model, fit)
    sx, sy = geometry.scale
    if fit == "stretch":
        assert geometry.target == (0, 0, *model)
        return
    # One scale for both axes, up to rounding each side to whole pixels.
    s, t = geometry.source, geometry.target
    # Rounding a side to whole pixels moves its scale by at most half a pixel's worth.
    tol = 0.5 / min(t[2] - t[0], t[3] - t[1]) + 0.5 / min(s[2] - s[0], s[3] - s[1])
    assert abs(sx - sy) <= max(sx, sy) * 2 * tol + 1e-9
    if fit == "letterbox":
        assert geometry.source == (0, 0, *frame)
        assert t[2] - t[0] == model[0] or t[3] - t[1] == model[1]
    else:
        assert t == (0, 0, *model)
        assert s[2] - s[0] == frame[0] or s[3] - s[1] == frame[1]


@settings(max_examples=150, deadline=None)
@given(frames(), st.sampled_from(MODELS), st.sampled_from(FITS), st.booleans(), st.data())
def test_drawn_box_maps_back_within_a_pixel(
    frame: tuple[int, int], model: tuple[int, int], fit: Fit, antialias: bool, data: st.DataObject
) -> None:
    """A white box drawn in the seen part of the frame is found where `to_frame` says."""
    geometry = Geometry.fit(frame, model, fit, antialias=antialias)
    s = geometry.source
    sx, sy = geometry.scale
    # At least 3 model pixels each way, so it survives the shrink.
    min_w, min_h = int(np.ceil(3 / sx)) + 1, int(np.ceil(3 / sy)) + 1
    if s[2] - s[0] < min_w + 2 or s[3] - s[1] < min_h + 2:
        return
    x0 = data.draw(st.integers(s[0], s[2] - min_w))
    y0 = data.draw(st.integers(s[1], s[3] - min_h))
    x1 = data.draw(st.integers(x0 + min_w, s[2]))
    y1 = data.draw(st.integers(y0 + min_h, s[3]))
    image = np.zeros((frame[1], frame[0], 3), dtype=np.uint8)
    image[y0:y1, x0:x1] = 255
    fitted = geometry.prepare(image)
    ys, xs = np.nonzero(fitted[:, :, 0] > 127)
    found = geometry.to_frame([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1])[0]
    # Half a model pixel of coverage rounding each side, in frame pixels, plus one.
    tol = np.array([1 / sx, 1 / sy, 1 / sx, 1 / sy]) + 1.0
    assert np.all(np.abs(found - [x0, y0, x1, y1]) <= tol)


def test_letterbox_pads_and_centres_a_720p_frame() -> None:
    geometry = Geometry.fit((1280, 720), (300, 300), "letterbox", pad_value=114)
    assert geometry.target == (0, 65, 300, 234)
    frame = np.full((720, 1280, 3), 7, dtype=np.uint8)
    out = geometry.new_input()
    out[...] = 0
    assert geometry.prepare(frame, out) is out
    assert np.all(out[:65] == 114)
    assert np.all(out[234:] == 114)
    assert np.all(out[65:234] == 7)


def test_buffer_reused_across_regions_is_repadded() -> None:
    frame = np.full((720, 1280, 3), 50, dtype=np.uint8)
    out = Geometry.fit((1280, 720), (300, 300), crop=(0, 0, 400, 400)).prepare(frame)
    # A region cut by the frame's bottom edge is letterboxed: stale pixels must not show.
    edge = Geometry.fit((1280, 720), (300, 300), crop=(0, 500, 400, 900))
    assert edge.crop == (0, 500, 400, 720)
    edge.prepare(frame, out)
    t = edge.target
    assert np.all(out[t[1] : t[3], t[0] : t[2]] == 50)
    assert np.all(out[: t[1]] == 114)
    assert np.all(out[t[3] :] == 114)


def test_crop_fit_keeps_the_centre() -> None:
    geometry = Geometry.fit((1280, 720), (300, 300), "crop")
    assert geometry.source == (280, 0, 1000, 720)
    frame = np.zeros((720, 1280, 3), dtype=np.uint8)
    frame[:, 640:] = 200
    out = geometry.prepare(frame)
    assert np.all(out[:, :149] == 0)
    assert np.all(out[:, 151:] == 200)


def test_keypoints_follow_boxes() -> None:
    geometry = Geometry.fit((1920, 1080), (640, 640), "letterbox", crop=(600, 200, 1200, 800))
    points = np.array([[[10.0, 20.0], [630.0, 600.0]]])
    boxes = geometry.to_frame([10.0, 20.0, 630.0, 600.0], clip=False)
    np.testing.assert_allclose(geometry.points_to_frame(points).reshape(-1), boxes[0])
    np.testing.assert_allclose(geometry.points_to_model(geometry.points_to_frame(points)), points)


def test_stretch_matches_the_old_whole_frame_resize() -> None:
    geometry = Geometry.fit((1280, 720), (300, 300), "stretch")
    np.testing.assert_allclose(geometry.to_frame([0, 0, 300, 300])[0], [0, 0, 1280, 720])
    np.testing.assert_allclose(geometry.to_frame([150, 150, 150, 150])[0], [640, 360, 640, 360])


def test_wrong_frame_size_is_an_error() -> None:
    geometry = Geometry.fit((1280, 720), (300, 300))
    with pytest.raises(EdgeAgentError, match="1280x720") as err:
        geometry.prepare(np.zeros((480, 640, 3), dtype=np.uint8))
    assert err.value.code == "input.invalid"
    with pytest.raises(EdgeAgentError):
        Geometry.fit((0, 720), (300, 300))


def test_a_text_line_at_the_pictures_edge_stays_in_the_frame_under_letterbox() -> None:
    # DBNet's unclip grows a line into the letterbox padding: its polygon came out with
    # negative y, outside the frame, where a Detection at the same place was clipped.
    g = Geometry.fit((1280, 720), (640, 640), "letterbox", 114)
    prob = np.zeros((640, 640), np.float32)
    prob[142:160, 100:300] = 0.9  # touching the top of the picture, which starts at y 140
    found = decode_dbnet(prob, (640, 640), DbnetConfig())
    assert min(y for _, y in found[0].polygon) < 140  # grown into the padding
    (line,) = to_frame(found, g)
    assert isinstance(line, TextBox)
    xs, ys = zip(*line.polygon, strict=True)
    assert min(ys) == 0.0
    assert 0.0 <= min(xs) < max(xs) <= 1280.0
    assert max(ys) <= 720.0
    # One wholly in the padding has nothing left in the frame: gone, as a box would be.
    prob[:] = 0.0
    prob[40:60, 100:300] = 0.9
    assert to_frame(decode_dbnet(prob, (640, 640), DbnetConfig()), g) == []


def test_a_nan_coordinate_from_the_model_never_reaches_the_frame() -> None:
    # min/max and np.clip pass NaN through and `x1 <= x0` is false for it: SSD and
    # BlazeFace boxes came out with null coordinates, each a new track every frame.
    boxes = np.array([[np.nan, 0.1, 0.5, 0.4], [0.1, 0.1, 0.5, 0.4]], np.float32)
    ssd = decode_ssd(
        boxes, np.array([1.0, 1.0]), np.array([0.9, 0.8]), 2, (300, 300),
        SsdConfig(labels={1: "person"}),
    )  # fmt: skip
    assert [d.score for d in ssd] == [pytest.approx(0.8)]
    reg = np.zeros((1, 896, 16), np.float32)
    logit = np.full((1, 896, 1), -20, np.float32)
    logit[0, 100, 0] = 5
    reg[0, 100, :4] = [np.nan, 0, 20, 20]
    assert decode_blazeface(reg, logit, (128, 128), BlazeFaceConfig()) == []
    g = Geometry.fit((640, 480), (128, 128), "stretch")
    broken = Detection(label="x", class_id=0, score=0.9, box=(10.0, float("nan"), 50.0, 60.0))
    assert to_frame([broken], g) == []
