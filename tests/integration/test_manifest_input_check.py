"""A manifest [input] that does not fit the model file fails at compile, alike on both
engines, with model.shape and what to set; never on the first frame, never silently."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from edge_agent.errors import EdgeAgentError
from edge_agent.runtime import create_backend
from edge_agent.runtime.base import RuntimeOptions
from tests.onnx_kit import FLOAT16, UINT8, image_manifest, onnx_model

BACKENDS = ["openvino", "onnxruntime"]


def _refused(backend: str, path: Path, **input_fields: object) -> EdgeAgentError:
    with pytest.raises(EdgeAgentError) as caught:
        create_backend(backend).compile(path, image_manifest(**input_fields), RuntimeOptions())
    assert caught.value.code == "model.shape", caught.value
    return caught.value


@pytest.fixture
def float_model(tmp_path: Path) -> Path:
    path = tmp_path / "float.onnx"
    path.write_bytes(onnx_model((1, 3, 32, 48)))
    return path


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_manifest_that_fits_compiles_and_runs(backend: str, float_model: Path) -> None:
    model = create_backend(backend).compile(float_model, image_manifest(), RuntimeOptions())
    try:
        frame = np.full((1, 32, 48, 3), 7, dtype=np.uint8)
        np.testing.assert_array_equal(model.infer({"x": frame})["y"], np.full((1, 3, 32, 48), 7))
    finally:
        model.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_wrong_input_name_fails_at_compile(backend: str, float_model: Path) -> None:
    err = _refused(backend, float_model, name="data")
    assert "'data' is not an input of the model (its inputs: x)" in err.problem
    assert "[input] name" in err.fix


@pytest.mark.parametrize("backend", BACKENDS)
def test_u8_declared_for_a_float_model_fails_at_compile(backend: str, float_model: Path) -> None:
    # OpenVINO ran this one on raw 0-255 frames, mean and scale skipped, without a word.
    err = _refused(backend, float_model, element_type="u8")
    assert "element_type u8, but the model's input x takes f32" in err.problem
    assert 'element_type = "f32"' in err.fix


def test_an_f16_input_runs_on_openvino_as_f32_declared(tmp_path: Path) -> None:
    # A model exported at half precision: the manifest can only say f32, and OpenVINO's
    # folded preprocessing converts to f16. It ran so before the input check, and must
    # still (ONNX Runtime cannot feed it, and says so at compile).
    path = tmp_path / "half.onnx"
    path.write_bytes(onnx_model((1, 3, 32, 48), FLOAT16))
    model = create_backend("openvino").compile(path, image_manifest(), RuntimeOptions())
    try:
        frame = np.full((1, 32, 48, 3), 7, dtype=np.uint8)
        np.testing.assert_array_equal(model.infer({"x": frame})["y"], np.full((1, 3, 32, 48), 7))
    finally:
        model.close()
    _refused("onnxruntime", path)


@pytest.mark.parametrize("backend", BACKENDS)
def test_f32_declared_for_a_uint8_model_fails_at_compile(backend: str, tmp_path: Path) -> None:
    path = tmp_path / "u8.onnx"
    path.write_bytes(onnx_model((1, 32, 48, 3), UINT8))
    err = _refused(backend, path, shape=(1, 32, 48, 3), layout="NHWC")
    assert "element_type f32, but the model's input x takes u8" in err.problem
    assert 'element_type = "u8"' in err.fix


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_model_of_another_rank_fails_at_compile(backend: str, tmp_path: Path) -> None:
    path = tmp_path / "chw.onnx"
    path.write_bytes(onnx_model((3, 32, 48)))
    err = _refused(backend, path)
    assert "shape has 4 dims, but the model's input x has 3" in err.problem


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_mean_given_with_a_u8_input_is_warned_of_and_the_pixels_go_raw(
    backend: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Neither engine applies a mean or scale to a uint8 input. Refused at parse, a
    # release signed with such a manifest, serving, became unreadable after an upgrade:
    # a warning says it instead, and the pixels go in as they are.
    path = tmp_path / "u8.onnx"
    path.write_bytes(onnx_model((1, 32, 48, 3), UINT8))
    manifest = image_manifest(
        shape=(1, 32, 48, 3), layout="NHWC", element_type="u8", mean=(127.5, 127.5, 127.5)
    )
    caplog.set_level(logging.WARNING, logger="edge_agent.runtime")
    model = create_backend(backend).compile(path, manifest, RuntimeOptions())
    try:
        frame = np.full((1, 32, 48, 3), 7, dtype=np.uint8)
        np.testing.assert_array_equal(model.infer({"x": frame})["y"], frame)
    finally:
        model.close()
    assert [r.getMessage() for r in caplog.records] == ["manifest_normalisation_ignored"]
