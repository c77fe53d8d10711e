"""Calibration's pure parts: metrics, the ladder, recipes, manifests written back."""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from edge_agent.catalog.manifest import Manifest, load_manifest
from edge_agent.errors import EdgeAgentError
from edge_agent.heads.base import Classification, Detection, Result
from edge_agent.quantize.api import to_toml
from edge_agent.quantize.calibrate import ladder
from edge_agent.quantize.metrics import cosine, detection_f1, top1_agreement
from edge_agent.quantize.recipe import load_recipe
from tests.conftest import REPO


def det(score: float, x: float = 0.0, label: str = "person") -> Detection:
    return Detection(label=label, class_id=1, score=score, box=(x, 0.0, x + 100.0, 200.0))


def test_identical_detections_agree_fully() -> None:
    frames: list[list[Result]] = [[det(0.9), det(0.8, 300)], [], [det(0.7)]]
    assert detection_f1(frames, frames, 0.5, 0.1) == 1.0


def test_a_missed_confident_box_is_counted() -> None:
    ref: list[list[Result]] = [[det(0.9)], [det(0.9)]]
    cand: list[list[Result]] = [[det(0.9)], []]
    # one TP, one FN: F1 = 2/3
    assert detection_f1(ref, cand, 0.5, 0.1) == pytest.approx(2 / 3)


def test_a_new_confident_box_is_a_false_positive() -> None:
    ref: list[list[Result]] = [[det(0.9)]]
    cand: list[list[Result]] = [[det(0.9), det(0.95, 400)]]
    assert detection_f1(ref, cand, 0.5, 0.1) == pytest.approx(2 / 3)


def test_a_flip_fp32_was_unsure_about_is_not_counted() -> None:
    # FP32 scored 0.45 (just under 0.5); INT8 scores 0.65 and reports it. FP32 was unsure.
    ref: list[list[Result]] = [[det(0.9), det(0.45, 300)]]
    cand: list[list[Result]] = [[det(0.88), det(0.65, 300)]]
    assert detection_f1(ref, cand, 0.5, 0.1) == 1.0
    # Without the band the same flip is a false positive.
    assert detection_f1(ref, cand, 0.5, 0.0) < 1.0


def test_a_confident_box_dropping_below_threshold_is_a_miss() -> None:
    ref: list[list[Result]] = [[det(0.9)]]
    cand: list[list[Result]] = [[det(0.42)]]
    assert detection_f1(ref, cand, 0.5, 0.1) == 0.0


def test_labels_and_overlap_must_match() -> None:
    ref: list[list[Result]] = [[det(0.9)]]
    assert detection_f1(ref, [[det(0.9, label="car")]], 0.5, 0.1) == 0.0
    assert detection_f1(ref, [[det(0.9, x=150)]], 0.5, 0.1) == 0.0  # IoU 1/7


@given(st.lists(st.floats(0.0, 1.0), max_size=6), st.lists(st.floats(0.0, 1.0), max_size=6))
def test_detection_f1_is_a_fraction(a: list[float], b: list[float]) -> None:
    ref: list[list[Result]] = [[det(s, 120 * i) for i, s in enumerate(a)]]
    cand: list[list[Result]] = [[det(s, 120 * i) for i, s in enumerate(b)]]
    assert 0.0 <= detection_f1(ref, cand, 0.5, 0.1) <= 1.0


def test_top1_agreement() -> None:
    def cls(best: int) -> list[Result]:
        return [
            Classification(label=str(i), class_id=i, score=0.9 if i == best else 0.05)
            for i in range(3)
        ]

    assert top1_agreement([cls(0), cls(1)], [cls(0), cls(2)]) == 0.5


def test_cosine() -> None:
    x = np.arange(10, dtype=np.float32)
    assert cosine(x, x * 3) == pytest.approx(1.0)
    assert cosine(x, -x) == pytest.approx(-1.0)
    assert cosine(np.zeros(3), np.zeros(3)) == 1.0
    assert cosine(np.zeros(3), np.ones(3)) == 0.0


def test_ladder_walks_down_to_fp32() -> None:
    assert ladder("int8") == ["int8", "int8-scope", "int8-accuracy", "weights-int8", "fp32"]
    assert ladder("int8-accuracy") == ["int8-accuracy", "weights-int8", "fp32"]
    assert ladder("weights-int4") == ["weights-int4", "weights-int8", "fp32"]
    for mode in ("int8", "int8-accuracy", "weights-int8", "weights-int4"):
        assert ladder(mode)[-1] == "fp32"


@pytest.mark.parametrize(
    "path", sorted((REPO / "calibration").glob("*.toml")), ids=lambda p: p.stem
)
def test_reference_recipes_load(path: Path) -> None:
    recipe = load_recipe(path)
    assert recipe.max_drop <= 0.01
    assert (REPO / "models" / path.name).is_file(), "a recipe per reference model"


def test_recipe_rejects_unknown_keys(tmp_path: Path) -> None:
    bad = tmp_path / "r.toml"
    bad.write_text('mode = "int8"\nsubset = 300\n')
    with pytest.raises(EdgeAgentError, match="invalid at subset"):
        load_recipe(bad)


@pytest.mark.parametrize("path", sorted((REPO / "models").glob("*.toml")), ids=lambda p: p.stem)
def test_manifests_survive_writing_back(path: Path) -> None:
    manifest = load_manifest(path)
    text = to_toml(manifest.model_dump(mode="json", exclude_none=True))
    assert Manifest.model_validate(tomllib.loads(text)) == manifest
