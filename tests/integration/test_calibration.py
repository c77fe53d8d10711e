"""On-device INT8 calibration on the reference models, with the accuracy gate."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edge_agent.catalog.catalog import Catalog
from edge_agent.heads.base import Detection
from edge_agent.infer import infer_frame
from edge_agent.pipelines.capture import CaptureSinkSpec
from edge_agent.pipelines.runner import PipelineHandle
from edge_agent.pipelines.sources import FileSourceSpec
from edge_agent.pipelines.spec import ModelRef, PipelineSpec
from edge_agent.quantize.api import calibrate
from edge_agent.quantize.calibrate import CalibrationData
from edge_agent.quantize.data import load_clips, load_frames
from edge_agent.quantize.recipe import Recipe, load_recipe
from edge_agent.runtime import create_backend
from edge_agent.runtime.base import RuntimeOptions
from edge_agent.runtime.pool import ModelPool
from tests.conftest import REPO
from tests.integration.video import write_walk

RECIPES = REPO / "calibration"


@pytest.fixture(scope="module")
def samples(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("calset")
    subprocess.run(
        [sys.executable, str(RECIPES / "build_samples.py"), "--out", str(out)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    return out


def fast(recipe: Recipe, **changes: object) -> Recipe:
    # Throughput is measured for the report, not asserted: a second per variant will do.
    return recipe.model_copy(update={"bench_seconds": 1.0, **changes})


def test_person_ssdlite_int8_keeps_the_astronaut(
    catalog: Catalog, samples: Path, tmp_path: Path, astronaut: np.ndarray
) -> None:
    resolved = catalog.resolve("person-ssdlite")
    recipe = fast(load_recipe(RECIPES / "person-ssdlite.toml"), max_samples=48)
    data = CalibrationData(load_frames(samples / "images", recipe.max_samples), [])
    path, report = calibrate(resolved, data, recipe, tmp_path / "out")
    assert report.mode == "int8"
    assert report.metric == "detection-f1"
    assert report.metric_after >= 0.99
    # Never silently capped: every calibration sample was used, and the report says so.
    assert report.samples + report.holdout_samples == report.samples_available == 48
    assert report.size_after < report.size_before / 2
    assert report.throughput_before > 0
    assert report.throughput_after > 0
    assert path is not None
    assert (tmp_path / "out" / "model.report.json").is_file()
    # The written model is a model version the runtime loads like any other.
    resolved_q = catalog.resolve(str(path))
    assert resolved_q.manifest.quantization is not None
    assert resolved_q.manifest.quantization.mode == "int8"
    model = create_backend("openvino").compile(
        resolved_q.path, resolved_q.manifest, RuntimeOptions()
    )
    people = [
        d for d in infer_frame(model, resolved_q.manifest, astronaut) if isinstance(d, Detection)
    ]
    assert len(people) == 1
    assert people[0].label == "person"
    assert people[0].score > 0.8


def test_vad_full_int8_is_rejected_and_ladder_ends_on_weights(
    catalog: Catalog, samples: Path, tmp_path: Path
) -> None:
    resolved = catalog.resolve("vad-silero")
    recipe = fast(load_recipe(RECIPES / "vad-silero.toml"))
    data = CalibrationData([], load_clips(samples / "speech", 16000))
    path, report = calibrate(resolved, data, recipe, tmp_path / "out")
    rungs = {r.rung: r for r in report.rungs}
    assert not rungs["int8"].passed
    assert rungs["int8"].drop > recipe.max_drop
    assert report.mode == "weights-int8"
    assert report.metric == "frame-agreement"
    assert report.metric_after >= 0.99
    assert path is not None
    assert [r.rung for r in report.rungs][-1] == "weights-int8"


def test_calibrate_from_a_pipelines_capture(catalog: Catalog, tmp_path: Path) -> None:
    video = write_walk(tmp_path / "walk.avi", empty=20, crossing=30)
    spec = PipelineSpec(
        id="dock-cam",
        model=ModelRef(name="person-ssdlite"),
        source=FileSourceSpec(path=video.path),
        sinks=[CaptureSinkSpec(frames=24, min_interval_s=0.0, seed=7)],
    )
    handle = PipelineHandle(spec, ModelPool(catalog))
    try:
        handle.run()
    finally:
        handle.close()
    captured = sorted((catalog.cache / "captures" / "dock-cam").glob("slot-*.jpg"))
    assert len(captured) == 24
    recipe = tmp_path / "recipe.toml"
    # Top-level keys must come before the recipe's [ignored_scope] table.
    recipe.write_text("bench_seconds = 1.0\n" + (RECIPES / "person-ssdlite.toml").read_text())
    proc = subprocess.run(
        [sys.executable, "-m", "edge_agent", "calibrate", "--model", "person-ssdlite",
         "--data", "pipeline:dock-cam", "--recipe", str(recipe), "--out", str(tmp_path / "q"),
         "--json"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    for key in ("metric", "metric_before", "metric_after", "throughput_before",
                "throughput_after", "speedup", "samples", "mode", "precision_before"):  # fmt: skip
        assert key in report, key
    assert report["samples_available"] == 24
    assert report["precision_before"] == "f32"
    assert report["mode"] == "int8"
    assert Path(report["path"]).is_file()


def test_text_det_plain_int8_fails_and_the_gate_holds(
    catalog: Catalog, samples: Path, tmp_path: Path
) -> None:
    resolved = catalog.resolve("text-det-ppocr")
    # One accuracy-control iteration: each re-ranks ~100 layer groups with a compile
    # apiece. The gate, not NNCF, decides what ships, so the outcome is judged the same.
    recipe = fast(load_recipe(RECIPES / "text-det-ppocr.toml"), accuracy_iterations=1)
    data = CalibrationData(load_frames(samples / "text", 12), [])
    path, report = calibrate(resolved, data, recipe, tmp_path / "out")
    rungs = {r.rung: r for r in report.rungs}
    assert report.metric == "text-mask-f1"
    assert not rungs["int8"].passed, rungs["int8"].reason
    assert "int8-accuracy" in rungs
    # Whatever won is within max_drop of FP32 (FP32 itself trivially is).
    assert report.metric_after >= report.metric_before - recipe.max_drop
    if rungs["int8-accuracy"].passed:
        assert report.mode == "int8-accuracy"
        assert path is not None
    else:
        assert report.mode in {"weights-int8", "fp32"}
