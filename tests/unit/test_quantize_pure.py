"""Calibration's pure parts: metrics, the ladder, recipes, manifests written back, and how
an output folder is staged and published (on real files)."""

from __future__ import annotations

import os
import subprocess
import sys
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
from edge_agent.quantize.output import begin_output, check_output, discard, publish
from edge_agent.quantize.recipe import load_recipe
from edge_agent.quantize.tasks import build_task
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


def test_the_device_default_precision_is_the_rung_before_fp32() -> None:
    assert ladder("int8", "bf16")[-2:] == ["bf16", "fp32"]
    assert ladder("weights-int8", "f16") == ["weights-int8", "f16", "fp32"]
    # A device whose default is f32 (or does not say) has no such rung: it is FP32 itself.
    assert ladder("weights-int8", "f32") == ["weights-int8", "fp32"]
    assert ladder("weights-int8", "?") == ["weights-int8", "fp32"]


def test_a_recipe_cannot_skip_the_fp32_floor(tmp_path: Path) -> None:
    path = tmp_path / "r.toml"
    path.write_text('skip = ["int8-accuracy"]\n')
    assert load_recipe(path).skip == ["int8-accuracy"]
    path.write_text('skip = ["fp32"]\n')
    with pytest.raises(EdgeAgentError, match="floor"):
        load_recipe(path)


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


def _write_output(folder: Path, mode: str) -> None:
    (folder / "model.xml").write_text(f"<{mode}/>")
    (folder / "model.report.json").write_text(f'{{"mode": "{mode}"}}')


def test_publish_replaces_a_previous_output_whole(tmp_path: Path) -> None:
    out = tmp_path / "calibrated" / "person-ssdlite"
    first = begin_output(out)
    _write_output(first, "int8")
    (first / "model.bin").write_bytes(b"int8 weights")
    publish(first, out)
    second = begin_output(out)
    assert second.parent == out.parent  # same file system, so the rename is atomic
    _write_output(second, "fp32")
    publish(second, out)
    assert sorted(p.name for p in out.iterdir()) == ["model.report.json", "model.xml"]
    assert (out / "model.xml").read_text() == "<fp32/>"
    assert [p.name for p in out.parent.iterdir()] == ["person-ssdlite"]


def test_a_discarded_run_leaves_the_output_as_it_was(tmp_path: Path) -> None:
    out = tmp_path / "out"
    first = begin_output(out)
    _write_output(first, "int8")
    publish(first, out)
    failed = begin_output(out)
    _write_output(failed, "fp32")
    discard(failed)
    assert (out / "model.xml").read_text() == "<int8/>"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_check_output_refuses_what_it_must_not_replace(tmp_path: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    foreign = tmp_path / "home"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    for out, words in [
        (a_file, "not a folder"),
        (a_file / "out", "cannot write"),
        (foreign, "not a calibration output"),
    ]:
        with pytest.raises(EdgeAgentError, match=words) as caught:
            check_output(out)
        assert caught.value.code == "path.unwritable"
    assert (foreign / "notes.txt").read_text() == "keep me"
    # A new folder is fine, and checking it leaves nothing behind but its parent.
    check_output(tmp_path / "new" / "out")
    assert list((tmp_path / "new").iterdir()) == []


def test_a_killed_runs_staging_is_swept_but_a_live_ones_is_not(tmp_path: Path) -> None:
    out = tmp_path / "out"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    stale = tmp_path / f".out.partial-{dead.stdout.strip()}-0000"
    stale.mkdir()
    (stale / "model.bin").write_bytes(b"half a model")
    live = tmp_path / f".out.partial-{os.getppid()}-0000"
    live.mkdir()
    discard(begin_output(out))
    assert not stale.exists()
    assert live.is_dir()


def _no_runner(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    raise AssertionError("an image task never runs the model while splitting its samples")


def test_too_few_frames_to_split_is_a_calibration_error() -> None:
    manifest = load_manifest(REPO / "models" / "person-ssdlite.toml")
    frame = np.zeros((120, 160, 3), dtype=np.uint8)
    with pytest.raises(EdgeAgentError, match="too little data") as caught:
        build_task(manifest, [frame], [], 0.3, "auto", _no_runner, {})
    assert caught.value.code == "calibration.failed"
    task = build_task(manifest, [frame] * 4, [], 0.3, "auto", _no_runner, {})
    assert (len(task.calibration), len(task.holdout)) == (2, 2)


def test_a_recipe_metric_that_does_not_fit_the_head_is_refused() -> None:
    manifest = load_manifest(REPO / "models" / "person-ssdlite.toml")
    frames = [np.zeros((120, 160, 3), dtype=np.uint8)] * 4
    with pytest.raises(EdgeAgentError, match="does not fit") as caught:
        build_task(manifest, frames, [], 0.3, "frame-agreement", _no_runner, {})
    assert caught.value.code == "config.invalid"
    assert build_task(manifest, frames, [], 0.3, "cosine", _no_runner, {}).metric == "cosine"
