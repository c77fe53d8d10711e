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

from edge_agent.catalog.catalog import ResolvedModel
from edge_agent.catalog.manifest import Manifest, QuantizationInfo, load_manifest
from edge_agent.errors import EdgeAgentError
from edge_agent.heads.base import Classification, Detection, Result
from edge_agent.heads.vad import VadConfig
from edge_agent.quantize.api import to_toml
from edge_agent.quantize.calibrate import CalibrationData, Calibrator, ladder
from edge_agent.quantize.metrics import (
    cosine,
    detection_f1,
    speech_balanced_accuracy,
    top1_agreement,
)
from edge_agent.quantize.output import begin_output, check_output, discard, publish
from edge_agent.quantize.recipe import Recipe, load_recipe
from edge_agent.quantize.tasks import Outputs, Task, auto_metric, build_task, non_finite
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


def test_a_run_killed_between_the_two_renames_gets_the_previous_output_back(
    tmp_path: Path,
) -> None:
    # publish moves out aside, then staging to out: a kill between the two left the previous
    # output only in the aside folder, which the next run deleted as garbage.
    out = tmp_path / "out"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    aside = tmp_path / f".out.old-{dead.stdout.strip()}-0000"
    (aside / "out").mkdir(parents=True)
    (aside / "out" / "model.report.json").write_text('{"mode": "int8"}')
    (tmp_path / f".out.partial-{dead.stdout.strip()}-0000").mkdir()  # the new, never moved
    discard(begin_output(out))
    assert (out / "model.report.json").read_text() == '{"mode": "int8"}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    # With out in place, an aside folder is garbage as before.
    aside.mkdir()
    (aside / "out").mkdir()
    discard(begin_output(out))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert (out / "model.report.json").is_file()


def _no_runner(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    raise AssertionError("an image task never runs the model while splitting its samples")


def test_too_few_frames_to_split_is_a_calibration_error() -> None:
    manifest = load_manifest(REPO / "models" / "person-ssdlite.toml")
    frame = np.zeros((120, 160, 3), dtype=np.uint8)
    with pytest.raises(EdgeAgentError, match="too little data") as caught:
        build_task(manifest, [frame], [], 0.3, "auto", _no_runner, {})
    assert caught.value.code == "calibration.failed"
    # The fix names the fewest frames that hold out the minimum, and that many do.
    with pytest.raises(EdgeAgentError, match="at least 4 held out") as caught:
        build_task(manifest, [frame] * 9, [], 0.3, "auto", _no_runner, {})
    assert "give at least 10 frames" in caught.value.fix
    task = build_task(manifest, [frame] * 10, [], 0.3, "auto", _no_runner, {})
    assert (len(task.calibration), len(task.holdout)) == (6, 4)


def test_a_one_frame_holdout_is_refused_naming_the_minimum() -> None:
    # 50 frames at holdout 0.02 held out 1 frame, and its report said metric_after 1.0.
    manifest = load_manifest(REPO / "models" / "person-ssdlite.toml")
    frames = [np.zeros((120, 160, 3), dtype=np.uint8)] * 50
    with pytest.raises(EdgeAgentError, match="1 held-out frames; the gate needs at least 4"):
        build_task(manifest, frames, [], 0.02, "auto", _no_runner, {})


def _vad_task(metric: str = "auto") -> Task:
    manifest = load_manifest(REPO / "models" / "vad-silero.toml")
    return Task(manifest, auto_metric(manifest) if metric == "auto" else metric, [], [])


def _vad_outputs(probabilities: np.ndarray) -> list[dict[str, np.ndarray]]:
    head = load_manifest(REPO / "models" / "vad-silero.toml").head
    assert isinstance(head, VadConfig)
    state = np.zeros((2, 1, 128), dtype=np.float32)
    return [
        {head.probability: np.asarray([[p]], dtype=np.float32), head.state_out: state}
        for p in probabilities
    ]


def test_a_vad_that_never_flags_speech_fails_on_mostly_silent_audio() -> None:
    # 1% speech, as a quiet site's microphone records: plain agreement scored 0.99 and a
    # 0.01 gate passed a model that flags nothing.
    reference = np.where(np.arange(1000) % 100 == 0, 0.9, 0.05)
    task = _vad_task()
    assert task.metric == "speech-balanced-accuracy"
    deaf = task.score(_vad_outputs(reference), _vad_outputs(np.zeros(1000)))
    assert deaf == pytest.approx(0.5)
    # ... and so does one that flags everything.
    assert task.score(_vad_outputs(reference), _vad_outputs(np.ones(1000))) == pytest.approx(0.5)
    assert task.score(_vad_outputs(reference), _vad_outputs(reference)) == 1.0


def test_speech_balanced_accuracy() -> None:
    a = np.array([0.9, 0.1, 0.6, 0.2])
    assert speech_balanced_accuracy(a, a, 0.5) == 1.0
    assert speech_balanced_accuracy(a, 1 - a, 0.5) == 0.0
    # One of two speech windows missed, both silent ones kept: (0.5 + 1.0) / 2.
    assert speech_balanced_accuracy(a, np.array([0.8, 0.3, 0.4, 0.1]), 0.5) == 0.75
    # The only speech window missed: plain agreement said 0.75, each class counts alike.
    b = np.array([0.9, 0.1, 0.2, 0.3])
    assert speech_balanced_accuracy(b, np.zeros(4), 0.5) == 0.5
    with pytest.raises(ValueError, match="length"):
        speech_balanced_accuracy(a, a[:3], 0.5)


def test_nan_outputs_fail_the_rung_rather_than_read_as_no_speech() -> None:
    reference = np.where(np.arange(1000) % 100 == 0, 0.9, 0.05)
    broken = _vad_outputs(reference)
    for item in broken[500:]:
        item["output"] = np.full((1, 1), np.nan, dtype=np.float32)  # the manifest's probability
    task = _vad_task()
    assert task.score(_vad_outputs(reference), broken) == 0.0
    # Even under the metric a recipe may pick for any model.
    assert _vad_task("cosine").score(_vad_outputs(reference), broken) == 0.0
    assert non_finite(_vad_outputs(reference), broken) == 500


def test_plain_frame_agreement_is_refused_in_a_recipe(tmp_path: Path) -> None:
    path = tmp_path / "r.toml"
    path.write_text('metric = "frame-agreement"\n')
    with pytest.raises(EdgeAgentError, match="speech-balanced-accuracy"):
        load_recipe(path)


def test_cosine_compares_every_output() -> None:
    # A candidate whose scores flipped sign while its boxes match scored 1.0: only the
    # alphabetically first output ("boxes") was compared.
    manifest = load_manifest(REPO / "models" / "person-ssdlite.toml")
    task = Task(manifest, "cosine", [], [])
    rng = np.random.default_rng(0)
    reference: list[Outputs] = [
        {"boxes": rng.random((10, 4)), "scores": rng.random(10)} for _ in range(5)
    ]
    candidate: list[Outputs] = [
        {"boxes": r["boxes"], "scores": -np.asarray(r["scores"], dtype=np.float64)}
        for r in reference
    ]
    assert task.score(reference, candidate) < 0.0
    assert task.score(reference, reference) == pytest.approx(1.0)


def test_a_recipe_metric_that_does_not_fit_the_head_is_refused() -> None:
    manifest = load_manifest(REPO / "models" / "person-ssdlite.toml")
    frames = [np.zeros((120, 160, 3), dtype=np.uint8)] * 10
    with pytest.raises(EdgeAgentError, match="does not fit") as caught:
        build_task(manifest, frames, [], 0.3, "speech-balanced-accuracy", _no_runner, {})
    assert caught.value.code == "config.invalid"
    assert build_task(manifest, frames, [], 0.3, "cosine", _no_runner, {}).metric == "cosine"


def test_a_calibrated_model_is_refused_as_the_fp32_reference(tmp_path: Path) -> None:
    # A store's person-ssdlite-int8 became "FP32": metric_before 1.0 and precision_before
    # f32 were false, and each generation could lose another max_drop.
    manifest = load_manifest(REPO / "models" / "person-ssdlite.toml")
    calibrated = manifest.model_copy(
        update={
            "format": "ir",
            "quantization": QuantizationInfo(
                mode="int8", metric="detection-f1", metric_before=1.0, metric_after=1.0,
                max_drop=0.01, samples=21, speedup=1.8, report="model.report.json",
            ),
        }
    )  # fmt: skip
    resolved = ResolvedModel(manifest=calibrated, path=tmp_path / "model.xml")
    frames = [np.zeros((120, 160, 3), dtype=np.uint8)] * 10
    with pytest.raises(EdgeAgentError, match="already calibrated") as caught:
        Calibrator(resolved, CalibrationData(frames, []), Recipe(), "CPU")
    assert caught.value.code == "config.invalid"
    assert "calibrate the FP32 model it came from (--model person-ssdlite" in caught.value.fix


def test_a_holdout_above_half_is_refused_not_clamped(tmp_path: Path) -> None:
    # holdout 0.8 split frames 5/5 (one in every two), silently.
    path = tmp_path / "r.toml"
    path.write_text("holdout = 0.8\n")
    with pytest.raises(EdgeAgentError, match="invalid at holdout"):
        load_recipe(path)
    path.write_text("holdout = 0.5\n")
    assert load_recipe(path).holdout == 0.5


def test_the_current_folder_or_one_above_it_is_refused_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `--out .` passed the check, then failed at the last rename after the whole run (the
    # staging folder went inside the output), leaving an empty aside folder behind.
    here = tmp_path / "work" / "run"
    here.mkdir(parents=True)
    monkeypatch.chdir(here)
    for out in (Path(), Path("sub/.."), here, here.parent, Path("..")):
        with pytest.raises(EdgeAgentError, match="current folder") as caught:
            check_output(out)
        assert caught.value.code == "path.unwritable"
    assert list(tmp_path.rglob("*")) == [tmp_path / "work", here]
    check_output(Path("calibrated"))  # below it is fine


def test_a_manifest_with_any_text_is_written_as_toml_that_reads_back() -> None:
    # json.dumps wrote an emoji as a surrogate pair, which TOML refuses: the output was
    # published with a model.toml no runtime could load, and the CLI said it succeeded.
    manifest = load_manifest(REPO / "models" / "person-ssdlite.toml")
    text = 'Lobby 🚶 counter: "quoted", back\\slash, tab\t, del\x7f, line\nbreak, é'
    odd = manifest.model_copy(update={"description": text})
    written = to_toml(odd.model_dump(mode="json", exclude_none=True))
    assert Manifest.model_validate(tomllib.loads(written)).description == text
    assert tomllib.loads(to_toml({"clé": 1, "a-b_c": 2})) == {"clé": 1, "a-b_c": 2}


@given(st.text(max_size=40), st.text(max_size=10))
def test_to_toml_reads_back_any_string(value: str, key: str) -> None:
    assert tomllib.loads(to_toml({key or "k": value})) == {key or "k": value}
