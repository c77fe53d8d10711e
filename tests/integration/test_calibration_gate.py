"""The accuracy gate refuses to judge on held-out samples in which FP32 itself found nothing,
fails a candidate that answers NaN, and a rung that fails in NNCF only fails that rung: on the
real reference models (FP32 reference only, no NNCF run) or a one-layer model, a second or
two each."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import openvino as ov
import openvino.opset13 as ops
import pytest

from edge_agent.catalog.catalog import Catalog, ResolvedModel
from edge_agent.errors import EdgeAgentError
from edge_agent.quantize.calibrate import CalibrationData, Calibrator
from edge_agent.quantize.recipe import Recipe
from tests.onnx_kit import image_manifest


def test_an_empty_scene_cannot_judge_a_detector(catalog: Catalog, coffee: np.ndarray) -> None:
    # A capture taken while nobody was there: every candidate, a broken one too, found
    # "nothing" as FP32 did and the gate scored it 1.0.
    data = CalibrationData([coffee] * 10, [])
    with pytest.raises(EdgeAgentError, match="FP32 finds 0 objects in the 4 held-out") as caught:
        Calibrator(catalog.resolve("person-ssdlite"), data, Recipe(), "CPU")
    assert caught.value.code == "calibration.failed"
    assert "capture while people" in caught.value.fix


def test_a_detector_answering_nan_on_empty_frames_fails(
    catalog: Catalog, astronaut: np.ndarray, coffee: np.ndarray
) -> None:
    # Held out: frames 0, 3, 6 (the astronaut) and 9 (no one).
    frames = [astronaut if i in (0, 3, 6) else coffee for i in range(10)]
    calibrator = Calibrator(catalog.resolve("person-ssdlite"), CalibrationData(frames, []),
                            Recipe(), "CPU")  # fmt: skip
    task, reference = calibrator.task, calibrator.reference
    assert task.score(reference, reference) == 1.0
    # NaN where FP32 saw nobody used to read as "no box", agreeing with FP32.
    broken = [dict(r) for r in reference]
    broken[3] = {k: np.full_like(v, np.nan) for k, v in reference[3].items()}
    assert task.score(reference, broken) == 0.0


def test_silence_cannot_judge_a_vad(catalog: Catalog) -> None:
    rng = np.random.default_rng(0)
    hiss = [(rng.standard_normal(16000 * 3) * 1e-3).astype(np.float32) for _ in range(3)]
    with pytest.raises(EdgeAgentError, match="FP32 flags 0 of the 94 held-out windows") as caught:
        Calibrator(catalog.resolve("vad-silero"), CalibrationData([], hiss), Recipe(), "CPU")
    assert caught.value.code == "calibration.failed"
    assert "at least 16 of each" in str(caught.value)


def test_an_nncf_error_fails_its_rung_and_the_ladder_goes_on(tmp_path: Path) -> None:
    # NNCF 3.4 refuses INT4 groups of 128 on a layer 96 wide with InvalidGroupSizeError,
    # which ended the whole run (a traceback in the CLI) instead of trying weights-int8.
    rng = np.random.default_rng(0)
    x = ops.parameter([1, 3, 32, 96], np.float32, name="x")
    weights = ops.constant(rng.standard_normal((96, 3)).astype(np.float32))
    y = ops.reduce_mean(ops.matmul(x, weights, False, False), [1, 2], False)
    y.output(0).get_tensor().set_names({"y"})
    ov.save_model(ov.Model([y], [x], "tiny"), str(tmp_path / "model.xml"))
    manifest = image_manifest(shape=(1, 3, 32, 96)).model_copy(update={"format": "ir"})
    resolved = ResolvedModel(manifest=manifest, path=tmp_path / "model.xml")
    frames = [rng.integers(0, 255, (64, 192, 3), dtype=np.uint8) for _ in range(10)]
    calibrator = Calibrator(
        resolved, CalibrationData(frames, []), Recipe(mode="weights-int4"), "CPU"
    )
    outcome = calibrator.walk()
    first = outcome.rungs[0]
    assert (first.rung, first.passed) == ("weights-int4", False)
    assert first.reason.startswith("failed: InvalidGroupSizeError: "), first.reason
    assert outcome.rung == "weights-int8"


def test_four_recordings_at_a_small_holdout_keep_one_held_out(catalog: Catalog) -> None:
    # 4 WAVs at holdout 0.1 held out none ("0 held-out samples ... give at least 4 frames"):
    # one is held out, and the gate goes on to judge its 94 windows.
    rng = np.random.default_rng(0)
    hiss = [(rng.standard_normal(16000 * 3) * 1e-3).astype(np.float32) for _ in range(4)]
    recipe = Recipe(holdout=0.1)
    with pytest.raises(EdgeAgentError, match="FP32 flags 0 of the 94 held-out windows"):
        Calibrator(catalog.resolve("vad-silero"), CalibrationData([], hiss), recipe, "CPU")
