"""Host preprocessing, and OpenVINO's folded preprocessing checked against it."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import openvino as ov
import pytest
from hypothesis import given
from hypothesis import strategies as st

from edge_agent.catalog.manifest import ImageInput
from edge_agent.errors import EdgeAgentError
from edge_agent.runtime.openvino_backend import host_swaps_colour
from edge_agent.runtime.preprocess import (
    center_crop,
    fit_frame,
    fit_frames,
    fit_frames_into,
    frame_tensor,
    frames_tensor,
)
from tests.conftest import CompileFn, bgr, sample

Frame = npt.NDArray[np.uint8]


def _frame(height: int, width: int) -> Frame:
    """A BGR frame whose every pixel is distinguishable: B=row, G=column, R=both mixed."""
    y, x = np.mgrid[0:height, 0:width]
    return np.ascontiguousarray(
        np.stack([y % 256, x % 256, (7 * y + 3 * x) % 256], axis=-1), dtype=np.uint8
    )


def _spec(**changes: object) -> ImageInput:
    base: dict[str, object] = {
        "name": "x",
        "shape": (1, 3, 48, 64),
        "layout": "NCHW",
        "element_type": "f32",
        "color": "BGR",
    }
    return ImageInput.model_validate({**base, **changes})


def _f64(values: object) -> npt.NDArray[np.float64]:
    return np.asarray(values, dtype=np.float64)


def test_center_crop_is_a_centred_view() -> None:
    frame = _frame(480, 640)
    crop = center_crop(frame, 0.5)
    assert crop.shape == (240, 240, 3)
    assert np.shares_memory(crop, frame), "a slice, not a copy"
    # top = (480 - 240) // 2, left = (640 - 240) // 2
    assert (crop[0, 0] == frame[120, 200]).all()
    assert (crop[-1, -1] == frame[359, 439]).all()


def test_center_crop_of_a_portrait_frame() -> None:
    frame = _frame(300, 100)
    crop = center_crop(frame, 0.875)
    assert crop.shape == (88, 88, 3)  # round(87.5) = 88; top = (300 - 88) // 2
    assert (crop[0, 0] == frame[106, 6]).all()


def test_center_crop_of_one_keeps_the_whole_frame() -> None:
    frame = _frame(30, 50)
    assert center_crop(frame, 1.0) is frame


def test_center_crop_never_empties_a_tiny_frame() -> None:
    assert center_crop(_frame(2, 3), 0.1).shape == (1, 1, 3)


@given(st.integers(1, 400), st.integers(1, 400), st.floats(0.01, 0.999))
def test_center_crop_properties(height: int, width: int, fraction: float) -> None:
    frame = _frame(height, width)
    crop = center_crop(frame, fraction)
    side = crop.shape[0]
    assert crop.shape == (side, side, 3)
    assert 1 <= side <= min(height, width)
    assert abs(side - max(1.0, min(height, width) * fraction)) <= 0.5 + 1e-9
    # Centred: the margins either side differ by at most one pixel.
    if height < 256 and width < 256:
        top, left = int(crop[0, 0, 0]), int(crop[0, 0, 1])  # B = row, G = column
        bottom, right = height - top - side, width - left - side
        assert 0 <= bottom - top <= 1
        assert 0 <= right - left <= 1


def test_fit_frame_at_model_size_is_not_copied() -> None:
    frame = _frame(48, 64)
    fitted = fit_frame(frame, _spec())
    assert np.shares_memory(fitted, frame)
    assert fitted.shape == (48, 64, 3)


def test_fit_frame_at_model_size_in_nhwc() -> None:
    frame = _frame(128, 96)
    fitted = fit_frame(frame, _spec(shape=(1, 128, 96, 3), layout="NHWC"))
    assert np.shares_memory(fitted, frame)


@pytest.mark.parametrize("size", [(480, 640), (20, 30), (48, 65), (64, 48)])
def test_fit_frame_resizes_to_the_model_size(size: tuple[int, int]) -> None:
    frame = _frame(*size)
    fitted = fit_frame(frame, _spec())
    assert fitted.shape == (48, 64, 3)
    assert fitted.dtype == np.uint8
    assert fitted.flags.c_contiguous
    assert not np.shares_memory(fitted, frame)


def test_fit_frame_of_a_flat_colour_stays_that_colour() -> None:
    frame = np.full((333, 517, 3), (10, 200, 77), dtype=np.uint8)
    fitted = fit_frame(frame, _spec())
    assert (fitted == np.array([10, 200, 77], dtype=np.uint8)).all()


def test_fit_frame_crops_before_resizing() -> None:
    # A green centre square in a red frame: the 0.5 crop is exactly the green square.
    frame = np.zeros((100, 300, 3), dtype=np.uint8)
    frame[:, :, 2] = 255
    frame[25:75, 125:175] = (0, 255, 0)
    fitted = fit_frame(frame, _spec(shape=(1, 3, 10, 10), center_crop=0.5))
    assert fitted.shape == (10, 10, 3)
    assert (fitted == np.array([0, 255, 0], dtype=np.uint8)).all()


def test_fit_frame_cropped_at_model_size_is_contiguous() -> None:
    frame = _frame(256, 256)
    fitted = fit_frame(frame, _spec(shape=(1, 3, 224, 224), center_crop=0.875))
    assert fitted.shape == (224, 224, 3)
    assert fitted.flags.c_contiguous
    assert (fitted[0, 0] == frame[16, 16]).all()


def test_a_centre_cropped_model_takes_a_frame_at_its_size_as_it_is() -> None:
    # Whoever has a whole frame fits it (crop, then resize) once; a frame at the model's
    # size is that fitted input, and cropping it again showed the model 0.875 squared of
    # the short side.
    spec = _spec(shape=(1, 3, 224, 224), center_crop=0.875)
    fitted = fit_frame(_frame(480, 640), spec)
    assert fitted.shape == (224, 224, 3)
    assert np.array_equal(fit_frame(fitted, spec), fitted)
    out = np.zeros((1, 224, 224, 3), dtype=np.uint8)
    fit_frames_into(fitted[None], spec, out)
    assert np.array_equal(out[0], fitted)
    assert np.array_equal(frame_tensor(fitted, spec)[0], fitted.transpose(2, 0, 1))


@pytest.mark.parametrize(
    ("size", "changes"),
    [
        ((48, 64), {}),  # at the model's size: copied as it is
        ((48, 64), {"shape": (2, 3, 48, 64)}),  # at the model's size, batch 2
        ((480, 640), {}),  # resized
        ((100, 300), {"fit": "letterbox", "pad_value": 9}),  # resized into bands of padding
        ((256, 256), {"shape": (2, 3, 224, 224), "center_crop": 0.875}),  # cropped, batch 2
    ],
)
@pytest.mark.parametrize("to_rgb", [False, True])
def test_fit_frames_into_writes_what_fit_frames_returns(
    size: tuple[int, int], changes: dict[str, object], to_rgb: bool
) -> None:
    spec = _spec(**changes)
    frames = np.stack([_frame(*size), 255 - _frame(*size)][: spec.shape[0]])
    out = np.full((spec.shape[0], spec.height, spec.width, 3), 77, dtype=np.uint8)
    fit_frames_into(frames, spec, out, to_rgb)
    want = fit_frames(frames, spec)
    assert (out == (want[..., ::-1] if to_rgb else want)).all()


def test_fit_frames_into_refuses_frames_that_are_not_three_channel() -> None:
    out = np.zeros((1, 48, 64, 3), dtype=np.uint8)
    with pytest.raises(EdgeAgentError, match="not height x width x 3") as caught:
        fit_frames_into(np.zeros((1, 48, 64, 4), dtype=np.uint8), _spec(), out)
    assert caught.value.code == "model.shape"
    with pytest.raises(EdgeAgentError, match="batch 1"):
        fit_frames_into(np.zeros((2, 48, 64, 3), dtype=np.uint8), _spec(), out)


def test_nchw_f32_bgr_tensor_by_hand() -> None:
    spec = _spec(mean=(1.0, 2.0, 3.0), scale=(2.0, 4.0, 8.0))
    frame = _frame(48, 64)
    frame[1, 2] = (10, 20, 30)  # B, G, R
    before = frame.copy()
    tensor = frame_tensor(frame, spec)
    assert tensor.shape == (1, 3, 48, 64)
    assert tensor.dtype == np.float32
    assert tensor.flags.c_contiguous
    # ((10-1)/2, (20-2)/4, (30-3)/8), channels in BGR order.
    np.testing.assert_allclose(_f64(tensor[0, :, 1, 2]), _f64([4.5, 4.5, 3.375]))
    assert (frame == before).all(), "the caller's frame is untouched"


def test_nhwc_u8_rgb_tensor_by_hand() -> None:
    spec = _spec(shape=(1, 48, 64, 3), layout="NHWC", element_type="u8", color="RGB")
    frame = _frame(48, 64)
    frame[5, 7] = (10, 20, 30)  # B, G, R
    tensor = frame_tensor(frame, spec)
    assert tensor.shape == (1, 48, 64, 3)
    assert tensor.dtype == np.uint8
    assert tensor.flags.c_contiguous
    assert tensor[0, 5, 7].tolist() == [30, 20, 10]
    assert tensor[0, 0, 3].tolist() == [9, 3, 0]  # R = 7*0 + 3*3, G = column 3, B = row 0


def test_nhwc_f32_rgb_tensor_by_hand() -> None:
    spec = _spec(
        shape=(1, 48, 64, 3),
        layout="NHWC",
        color="RGB",
        mean=(127.5, 127.5, 127.5),
        scale=(127.5, 127.5, 127.5),
    )
    frame = _frame(48, 64)
    frame[0, 0] = (0, 255, 127)  # B, G, R
    tensor = frame_tensor(frame, spec)
    assert tensor.dtype == np.float32
    np.testing.assert_allclose(_f64(tensor[0, 0, 0]), _f64([-0.5 / 127.5, 1.0, -1.0]))


def test_nchw_u8_rgb_tensor_by_hand() -> None:
    spec = _spec(element_type="u8", color="RGB")
    frame = _frame(48, 64)
    frame[3, 4] = (1, 2, 3)
    tensor = frame_tensor(frame, spec)
    assert tensor.shape == (1, 3, 48, 64)
    assert tensor.dtype == np.uint8
    assert tensor[0, :, 3, 4].tolist() == [3, 2, 1]


def test_frame_tensor_resizes_first() -> None:
    spec = _spec(mean=(10.0, 10.0, 10.0), scale=(2.0, 2.0, 2.0))
    frame = np.full((480, 640, 3), (30, 50, 70), dtype=np.uint8)
    tensor = frame_tensor(frame, spec)
    assert tensor.shape == (1, 3, 48, 64)
    np.testing.assert_allclose(_f64(tensor[0, :, 20, 30]), _f64([10.0, 20.0, 30.0]))


def _plain_tensor(frame: Frame, spec: ImageInput) -> npt.NDArray[np.float64]:
    """The preprocessing written the obvious way, to check the fast path against."""
    image = fit_frame(frame, spec).astype(np.float64)
    if spec.color == "RGB":
        image = image[:, :, ::-1]
    if spec.element_type == "f32":
        image = (image - np.asarray(spec.mean)) / np.asarray(spec.scale)
    if spec.layout == "NCHW":
        image = image.transpose(2, 0, 1)
    return image[None]


@given(
    st.sampled_from(["NCHW", "NHWC"]),
    st.sampled_from(["u8", "f32"]),
    st.sampled_from(["RGB", "BGR"]),
    st.tuples(*[st.floats(0, 255, allow_nan=False)] * 3),
    st.tuples(*[st.floats(0.5, 128, allow_nan=False)] * 3),
    st.sampled_from([(48, 64), (31, 97), (480, 640)]),
)
def test_fast_tensor_matches_the_plain_formula(
    layout: str,
    element_type: str,
    color: str,
    mean: tuple[float, float, float],
    scale: tuple[float, float, float],
    size: tuple[int, int],
) -> None:
    shape = (1, 3, 24, 32) if layout == "NCHW" else (1, 24, 32, 3)
    spec = _spec(
        shape=shape, layout=layout, element_type=element_type, color=color, mean=mean, scale=scale
    )
    frame = _frame(*size)
    got = frame_tensor(frame, spec)
    assert got.dtype == (np.uint8 if element_type == "u8" else np.float32)
    assert got.flags.c_contiguous
    np.testing.assert_allclose(_f64(got), _plain_tensor(frame, spec), rtol=1e-5, atol=1e-4)


@given(
    st.sampled_from(["RGB", "BGR"]),
    st.tuples(*[st.floats(0, 255, allow_nan=False)] * 3),
    st.tuples(*[st.sampled_from([1.0]) | st.floats(0.5, 128, allow_nan=False)] * 3),
)
def test_float_nchw_tensor_gives_the_formula_for_every_uint8_value(
    color: str, mean: tuple[float, float, float], scale: tuple[float, float, float]
) -> None:
    # Every uint8 value in every channel, in a different order per channel; the frame is
    # at the model's size, so only the conversion (cv2.addWeighted) stands between it and
    # the tensor. It multiplies by a rounded reciprocal, so allow a few float32 ulps of
    # the largest magnitude in play.
    values = np.arange(256, dtype=np.uint8).reshape(16, 16)
    frame = np.ascontiguousarray(np.stack([values, values.T, values[::-1]], axis=-1))
    spec = _spec(shape=(1, 3, 16, 16), color=color, mean=mean, scale=scale)
    got = frame_tensor(frame, spec)
    order = (2, 1, 0) if color == "RGB" else (0, 1, 2)
    for c, src in enumerate(order):
        want = (frame[:, :, src].astype(np.float64) - mean[c]) / scale[c]
        ulp = float(np.spacing(np.float32((255 + mean[c]) / scale[c])))
        np.testing.assert_allclose(_f64(got[0, c]), want, rtol=0, atol=4 * ulp)


def test_a_batch_is_its_frames_stacked() -> None:
    spec = _spec(shape=(2, 3, 48, 64), mean=(1.0, 2.0, 3.0), scale=(2.0, 4.0, 8.0))
    one, two = _frame(48, 64), _frame(96, 128)[::-1].copy()
    batch = frames_tensor(np.stack([one, _fitted(two, 64, 48)]), spec)
    single = spec.model_copy(update={"shape": (1, 3, 48, 64)})
    assert batch.shape == (2, 3, 48, 64)
    np.testing.assert_array_equal(batch[0], frame_tensor(one, single)[0])
    np.testing.assert_array_equal(batch[1], frame_tensor(_fitted(two, 64, 48), single)[0])
    assert fit_frames(np.stack([one, one]), spec).shape == (2, 48, 64, 3)


@pytest.mark.parametrize("count", [1, 3])
def test_frames_that_do_not_fill_the_batch_are_refused(count: int) -> None:
    spec = _spec(shape=(2, 3, 48, 64))
    frames = np.stack([_frame(48, 64)] * count)
    for prepare in (frames_tensor, fit_frames):
        with pytest.raises(EdgeAgentError, match="batch 2") as info:
            prepare(frames, spec)
        assert info.value.code == "model.shape"


def _fitted(frame: Frame, width: int, height: int) -> Frame:
    return fit_frame(frame, _spec(shape=(1, 3, height, width)))


# OpenVINO folds colour, type, normalisation and layout into the graph; the numpy
# version is the reference. Both run the same host resize, so they must agree.


def _raw_openvino(path: Any, feed: dict[str, Any]) -> dict[str, npt.NDArray[Any]]:
    """The model file as it is, no folded preprocessing, in f32."""
    core = ov.Core()
    compiled = core.compile_model(str(path), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    result = compiled(feed)
    return {name: np.asarray(result[out]) for out in compiled.outputs for name in out.get_names()}


def _close(a: npt.NDArray[Any], b: npt.NDArray[Any]) -> float:
    """Largest absolute difference, relative to the reference's range."""
    return float(np.abs(a - b).max() / max(1e-6, float(np.abs(b).max())))


def test_openvino_folding_matches_numpy_for_blazeface(compiled: CompileFn) -> None:
    model, resolved = compiled("face-blazeface", precision="f32")
    spec = resolved.manifest.input
    assert isinstance(spec, ImageInput)
    assert (spec.layout, spec.element_type, spec.color) == ("NHWC", "f32", "RGB")
    frame = bgr(sample("astronaut"))
    folded = model.infer({spec.name: frame[None]})
    reference = _raw_openvino(resolved.path, {spec.name: frame_tensor(frame, spec)})
    for name in ("regressors", "classificators"):
        assert folded[name].shape == reference[name].shape
        assert _close(folded[name], reference[name]) < 1e-4, name
    # The comparison can tell: feeding the wrong colour order moves the outputs far more.
    wrong = _raw_openvino(resolved.path, {spec.name: frame_tensor(frame[:, :, ::-1], spec)})
    assert _close(wrong["regressors"], reference["regressors"]) > 1e-2


@pytest.mark.parametrize("backend", ["openvino", "onnxruntime"])
def test_engines_match_numpy_for_text_orientation(compiled: CompileFn, backend: str) -> None:
    model, resolved = compiled("text-orientation", backend, precision="f32")
    spec = resolved.manifest.input
    assert isinstance(spec, ImageInput)
    assert (spec.layout, spec.color, spec.center_crop) == ("NCHW", "BGR", 0.875)
    frame = bgr(sample("coffee"))
    output = "fetch_name_0"
    got = model.infer({spec.name: frame[None]})[output]
    reference = _raw_openvino(resolved.path, {spec.name: frame_tensor(frame, spec)})[output]
    assert got.shape == reference.shape == (1, 4)
    np.testing.assert_allclose(_f64(got), _f64(reference), atol=1e-4)
    assert float(got.sum()) == pytest.approx(1.0, abs=1e-4)
    # atol 1e-4 is tight enough to notice a swapped colour order.
    wrong = _raw_openvino(resolved.path, {spec.name: frame_tensor(frame[:, :, ::-1], spec)})
    assert np.abs(wrong[output] - reference).max() > 1e-2


def test_text_orientation_folding_matches_onnxruntime(compiled: CompileFn) -> None:
    ov_model, resolved = compiled("text-orientation", "openvino", precision="f32")
    ort_model, _ = compiled("text-orientation", "onnxruntime", precision="f32")
    spec = resolved.manifest.input
    assert isinstance(spec, ImageInput)
    for name in ("coffee", "astronaut", "chelsea"):
        frame = bgr(sample(name))
        a = ov_model.infer({spec.name: frame[None]})["fetch_name_0"]
        b = ort_model.infer({spec.name: frame[None]})["fetch_name_0"]
        np.testing.assert_allclose(_f64(a), _f64(b), atol=1e-4, err_msg=name)


def test_uint8_rgb_model_gets_rgb_frames_swapped_on_the_host(compiled: CompileFn) -> None:
    # person-ssdlite takes uint8 RGB: the swap is the host's (host_swaps_colour), not a
    # layer of the graph, and what reaches the model must be the RGB frame all the same.
    model, resolved = compiled("person-ssdlite", precision="f32")
    spec = resolved.manifest.input
    assert isinstance(spec, ImageInput)
    assert (spec.layout, spec.element_type, spec.color) == ("NHWC", "u8", "RGB")
    assert host_swaps_colour(spec)
    frame = bgr(sample("astronaut"))
    before = frame.copy()
    got = model.infer({spec.name: frame[None]})
    assert np.array_equal(frame, before)  # the caller's frame is left as it was
    reference = _raw_openvino(resolved.path, {spec.name: frame_tensor(frame, spec)})
    wrong = _raw_openvino(resolved.path, {spec.name: frame_tensor(frame[:, :, ::-1], spec)})
    scores = "detection_scores:0"
    assert got[scores].shape == reference[scores].shape
    np.testing.assert_allclose(_f64(got[scores]), _f64(reference[scores]), atol=1e-4)
    # The comparison can tell: the other colour order scores the astronaut differently.
    assert float(np.abs(_f64(wrong[scores]) - _f64(reference[scores])).max()) > 1e-2
