"""The accuracy gate refuses to judge on held-out samples in which FP32 itself found nothing,
and fails a candidate that answers NaN, on the real reference models (FP32 reference only:
no NNCF run, a second or two each)."""

from __future__ import annotations

import numpy as np
import pytest

from edge_agent.catalog.catalog import Catalog
from edge_agent.errors import EdgeAgentError
from edge_agent.quantize.calibrate import CalibrationData, Calibrator
from edge_agent.quantize.recipe import Recipe


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
