"""On-device INT8 calibration on the reference models, with the accuracy gate.

Kept cheap on a 2-core box: few samples, a twentieth of a second of throughput
per variant, and text-det at 320x320 (its dynamic input allows it). The gate's
verdicts are judged the same at that size: they compare decoded answers. Each
person-ssdlite INT8 run is ~10 s of NNCF here, so one run through the CLI serves
every test of a finished one, and the tests of plumbing that holds for any model
(cancels, captures) calibrate face-blazeface, which NNCF quantizes in a second.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nncf
import numpy as np
import openvino as ov
import pytest

from edge_agent.catalog.catalog import Catalog, ResolvedModel
from edge_agent.catalog.manifest import ImageInput
from edge_agent.clips import write_walk
from edge_agent.errors import EdgeAgentError
from edge_agent.heads.base import Detection
from edge_agent.infer import infer_frame
from edge_agent.paths import Layout
from edge_agent.pipelines.capture import CaptureSinkSpec
from edge_agent.pipelines.runner import PipelineHandle
from edge_agent.pipelines.sources import FileSourceSpec
from edge_agent.pipelines.spec import ModelRef, PipelineSpec
from edge_agent.quantize.api import calibrate
from edge_agent.quantize.calibrate import CalibrationData
from edge_agent.quantize.data import load_clips, load_frames
from edge_agent.quantize.output import REPORT
from edge_agent.quantize.recipe import CalibrationReport, Recipe, RungResult, load_recipe
from edge_agent.quantize.tasks import Task
from edge_agent.quantize.tasks import build_task as real_build_task
from edge_agent.runtime import create_backend
from edge_agent.runtime.base import RuntimeOptions
from edge_agent.runtime.pool import ModelPool
from tests.cli_kit import edge_agent_cli
from tests.conftest import REPO

RECIPES = REPO / "calibration"
OUTPUT = {"model.xml", "model.bin", "model.toml", "model.report.json"}
NNCF_BARS = ("Statistics collection", "━")
BENCH_S = 0.05
"""Throughput is measured for the report, not asserted: a few runs of each variant will do."""
PERSON_SAMPLES = 16


@pytest.fixture(scope="module")
def samples(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("calset")
    subprocess.run(
        [sys.executable, str(RECIPES / "build_samples.py"), "--out", str(out)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    return out


@pytest.fixture(scope="module")
def cpu_default() -> str:
    """The precision this CPU runs a model at when none is asked for: bf16 on AVX-512 BF16."""
    return str(ov.Core().get_property("CPU", "INFERENCE_PRECISION_HINT").get_type_name())


def fast(recipe: Recipe, **changes: object) -> Recipe:
    return recipe.model_copy(update={"bench_seconds": BENCH_S, **changes})


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A temporary folder of this test's own, so other processes' files cannot blur the diff."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setenv("TMPDIR", str(folder))  # native code (OpenVINO) reads this
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return edge_agent_cli(*args, timeout=600, env=env)


@dataclass(frozen=True)
class CliRun:
    """One `edge-agent calibrate` of person-ssdlite on the sample images, as a user runs it."""

    proc: subprocess.CompletedProcess[str]
    recipe: Path
    out: Path
    tmp: Path
    """The TMPDIR it ran with, its own, so other processes' files cannot blur what it left."""


@pytest.fixture(scope="module")
def person_cli(samples: Path, tmp_path_factory: pytest.TempPathFactory) -> CliRun:
    # The one full person-ssdlite calibration of this file: its output, its report and what
    # it printed are checked by one test, and replaced by a failing run in another.
    root = tmp_path_factory.mktemp("person-cli")
    state, tmp = root / "state", root / "tmp"
    tmp.mkdir()
    recipe = root / "recipe.toml"
    # Top-level keys must come before the recipe's [ignored_scope] table.
    recipe.write_text(
        f"bench_seconds = {BENCH_S}\nmax_samples = {PERSON_SAMPLES}\n"
        + (RECIPES / "person-ssdlite.toml").read_text()
    )
    env = {**os.environ, "EDGE_AGENT_STATE_DIR": str(state), "TMPDIR": str(tmp)}
    # Without --json (the capture test runs with it) and without --out.
    proc = cli("calibrate", "--model", "person-ssdlite", "--data", str(samples / "images"),
               "--recipe", str(recipe), env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return CliRun(proc, recipe, state / "calibrated" / "person-ssdlite", tmp)


def test_person_ssdlite_int8_keeps_the_astronaut(
    person_cli: CliRun, catalog: Catalog, astronaut: np.ndarray, cpu_default: str
) -> None:
    proc, out = person_cli.proc, person_cli.out
    # stdout carries the result table and nothing else; NNCF's progress bars and our
    # progress lines go to stderr.
    assert "calibration of person-ssdlite: int8" in proc.stdout
    for bar in NNCF_BARS:
        assert bar not in proc.stdout
    assert "Statistics collection" in proc.stderr
    assert "calibrate person-ssdlite" in proc.stderr
    assert "calibrate person-ssdlite" not in proc.stdout
    # Every temporary folder NNCF, OpenVINO (its TF frontend too) or the benchmarks made is
    # gone (each run used to leave three /tmp/edge-ir-* behind, 15 MB). The in-process
    # runs below check it too, as the agent calibrates: before any exit-time clean-up.
    assert list(person_cli.tmp.iterdir()) == []
    # With no --out, the output goes to the state folder (it must survive a cache wipe). It
    # is complete and holds nothing else: no .fp32 scratch, no staging sibling.
    assert {p.name for p in out.iterdir()} == OUTPUT
    assert [p.name for p in out.parent.iterdir()] == ["person-ssdlite"]
    report = CalibrationReport.model_validate_json((out / REPORT).read_text())
    assert report.mode == "int8"
    assert report.metric == "detection-f1"
    assert report.metric_after >= 0.99
    # Gated as it will serve: on the device, at the precision it will run at (no pin).
    assert report.device == "CPU"
    assert report.rungs[-1].precision == report.precision == cpu_default
    assert report.precision_pinned is None
    # Never silently capped: every calibration sample was used, and the report says so.
    assert report.samples + report.holdout_samples == report.samples_available == PERSON_SAMPLES
    assert report.size_after < report.size_before / 2
    assert report.throughput_before > 0
    assert report.throughput_after > 0
    # The written model is a model version the runtime loads like any other.
    resolved_q = catalog.resolve(str(out / "model.xml"))
    assert resolved_q.manifest.quantization is not None
    assert resolved_q.manifest.quantization.mode == "int8"
    assert resolved_q.manifest.precision is None
    with create_backend("openvino").compile(
        resolved_q.path, resolved_q.manifest, RuntimeOptions()
    ) as model:
        assert model.report.precision == cpu_default
        people = [
            d
            for d in infer_frame(model, resolved_q.manifest, astronaut)
            if isinstance(d, Detection)
        ]
    assert len(people) == 1
    assert people[0].label == "person"
    assert people[0].score > 0.8


def test_a_cancel_is_heard_while_nncf_reads_the_samples(
    catalog: Catalog, samples: Path, tmp_path: Path
) -> None:
    # The agent's cancel and job deadline were heard between rungs only: a rung inside
    # NNCF (accuracy control on text-det: minutes) ran on to its end first. How NNCF is fed
    # samples is the same for every model: face-blazeface's rung begins in a second.
    resolved = catalog.resolve("face-blazeface")
    recipe = fast(load_recipe(RECIPES / "face-blazeface.toml"), max_samples=16)
    data = CalibrationData(
        load_frames(samples / "images", recipe.max_samples, _input(resolved)), []
    )
    heard: list[float] = []

    def progress(stage: str, fraction: float) -> None:
        if stage == "rung int8":
            heard.append(fraction)
            if len(heard) == 3:  # the rung began, then NNCF read two samples
                raise EdgeAgentError("cancelled", code="command.cancelled")

    with pytest.raises(EdgeAgentError) as caught:
        calibrate(resolved, data, recipe, tmp_path / "out", progress=progress)
    assert caught.value.code == "command.cancelled"
    assert heard == [0.0, 0.0, 0.0]
    assert not (tmp_path / "out").exists()


def test_vad_full_int8_is_rejected_and_ladder_ends_on_weights(
    catalog: Catalog, samples: Path, tmp_path: Path, private_tmp: Path
) -> None:
    resolved = catalog.resolve("vad-silero")
    recipe = fast(load_recipe(RECIPES / "vad-silero.toml"))
    data = CalibrationData([], load_clips(samples / "speech", 16000, recipe.max_audio_s))
    assert tempfile.gettempdir() == str(private_tmp)
    path, report = calibrate(resolved, data, recipe, tmp_path / "out")
    # A whole run in the agent's own process (NNCF on two rungs, a compressed winner and
    # three benchmarks) leaves no temporary folder either, not even until it exits.
    assert list(private_tmp.iterdir()) == []
    rungs = {r.rung: r for r in report.rungs}
    assert not rungs["int8"].passed
    assert rungs["int8"].drop > recipe.max_drop
    assert report.mode == "weights-int8"
    assert report.metric == "speech-balanced-accuracy"
    assert report.metric_after >= 0.99
    assert path.is_file()
    assert [r.rung for r in report.rungs][-1] == "weights-int8"


def _input(resolved: ResolvedModel) -> ImageInput:
    spec = resolved.manifest.input
    assert isinstance(spec, ImageInput)
    return spec


def _at_320(resolved: ResolvedModel) -> ResolvedModel:
    spec = resolved.manifest.input
    assert isinstance(spec, ImageInput)
    assert spec.dynamic
    manifest = resolved.manifest.model_copy(update={"input": spec.with_shape((1, 3, 320, 320))})
    return ResolvedModel(manifest=manifest, path=resolved.path)


def test_text_det_gate_scores_as_it_serves_and_pins_f32(
    catalog: Catalog, samples: Path, tmp_path: Path, cpu_default: str
) -> None:
    # A previous run's INT8 output sits in --out: this run keeps FP32 and must replace it
    # whole (it used to leave the old INT8 model.xml beside a report saying FP32).
    out = tmp_path / "out"
    out.mkdir()
    (out / "model.report.json").write_text('{"mode": "int8"}')
    (out / "model.xml").write_text("<old int8 model/>")
    resolved = _at_320(catalog.resolve("text-det-ppocr"))
    # max_drop 0: only a model answering exactly as FP32 passes, so FP32 wins whatever this
    # CPU computes in. Accuracy control is skipped: its layer ranking compiles the model
    # once per layer group (minutes here), and the gate, not NNCF, decides what ships.
    recipe = fast(
        load_recipe(RECIPES / "text-det-ppocr.toml"), max_drop=0.0, skip=["int8-accuracy"]
    )
    data = CalibrationData(load_frames(samples / "text", 12, _input(resolved)), [])
    told: list[tuple[str, float]] = []
    path, report = calibrate(
        resolved, data, recipe, out, progress=lambda stage, done: told.append((stage, done))
    )
    # Forward only, through every rung and the benchmarks after (the benchmark went back
    # to 0 after the last rung's three quarters).
    fractions = [done for _, done in told]
    assert fractions == sorted(fractions), told
    assert told[-1] == ("benchmark", 1.0)
    assert max(done for stage, done in told if stage.startswith("rung ")) > 0.5
    rungs: dict[str, RungResult] = {r.rung: r for r in report.rungs}
    assert report.metric == "text-mask-f1"
    # Plain INT8 is far outside even the reference recipe's max_drop of 0.01.
    assert not rungs["int8"].passed
    assert rungs["int8"].drop > 0.01, rungs["int8"].reason
    assert "int8-accuracy" not in rungs
    # Every candidate was scored at the precision it would serve at on this device.
    for rung in ("int8", "int8-scope", "weights-int8"):
        assert rungs[rung].precision == cpu_default, rungs[rung]
    if cpu_default in ("bf16", "f16"):
        # The device default is a rung of its own, before FP32, and judged at that precision.
        assert [r.rung for r in report.rungs][-2:] == [cpu_default, "fp32"]
        assert rungs[cpu_default].precision == cpu_default
        assert not rungs[cpu_default].passed
    assert report.mode == "fp32"
    # FP32 at f32 on the CPU is the reference itself: it must score exactly 1.0. (NNCF's
    # weight compression used to rewrite the FP32 model in place, so it did not.)
    assert rungs["fp32"].precision == "f32"
    assert rungs["fp32"].metric_after == 1.0
    assert report.precision == "f32"
    assert report.precision_pinned == "f32"
    # The whole previous output is gone; the new one is the FP32 model, pinned to f32.
    assert {p.name for p in out.iterdir()} == OUTPUT
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    assert json.loads((out / "model.report.json").read_text())["mode"] == "fp32"
    written = tomllib.loads((out / "model.toml").read_text())
    assert written["precision"] == "f32"
    assert written["input"]["shape"] == [1, 3, 320, 320]
    # ... and the runtime honours the pin with no --precision given.
    resolved_q = catalog.resolve(str(path))
    with create_backend("openvino").compile(
        resolved_q.path, resolved_q.manifest, RuntimeOptions()
    ) as model:
        assert model.report.precision == "f32"


class _StopError(Exception):
    """Raised from the progress callback, as a cancelled job would."""


def test_a_failed_run_leaves_the_previous_output_untouched(
    person_cli: CliRun,
    catalog: Catalog,
    samples: Path,
    private_tmp: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out = person_cli.out
    assert {p.name for p in out.iterdir()} == OUTPUT
    previous = {p.name: p.read_bytes() for p in out.iterdir()}

    # A second run that fails after writing its model (here a cancel from the progress
    # callback during the benchmark) must leave the first run's output exactly as it was.
    stages: list[str] = []

    def cancel_at_benchmark(stage: str, done: float) -> None:
        stages.append(stage)
        if stage == "benchmark":
            raise _StopError

    resolved = catalog.resolve("person-ssdlite")
    # NNCF's accuracy control tuned the model on the gate's held-out samples, so the gate
    # then judged the very samples the model had been made to pass: it must never see them.
    tasks: list[Task] = []
    tuned_on: list[object] = []
    real_control = nncf.quantize_with_accuracy_control

    def build_task(*args: Any) -> Task:
        tasks.append(real_build_task(*args))
        return tasks[-1]

    def control(model: Any, calibration: Any, validation: Any, *args: Any, **kw: Any) -> Any:
        tuned_on.extend(sample for _, sample in validation.get_data())
        return real_control(model, calibration, validation, *args, **kw)

    monkeypatch.setattr("edge_agent.quantize.calibrate.build_task", build_task)
    monkeypatch.setattr(nncf, "quantize_with_accuracy_control", control)
    # int8-accuracy first: it also drives NNCF's accuracy control through our validate
    # callback, cheaply, since the first quantized model already passes.
    rerun = fast(load_recipe(person_cli.recipe), mode="int8-accuracy")
    data = CalibrationData(load_frames(samples / "images", rerun.max_samples, _input(resolved)), [])
    with pytest.raises(_StopError):
        calibrate(resolved, data, rerun, out, progress=cancel_at_benchmark)
    rung_stages = [s for s in stages if s.startswith("rung ")]
    # One rung (the first passed), said again for every sample NNCF's accuracy control read.
    assert set(rung_stages) == {"rung int8-accuracy"}, stages
    assert len(rung_stages) > 1
    (task,) = tasks
    assert tuned_on
    assert all(any(t is c for c in task.calibration) for t in tuned_on)
    assert not any(t is h for t in tuned_on for h in task.holdout)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == previous
    assert [p.name for p in out.parent.iterdir()] == ["person-ssdlite"]
    # ... and, in the agent's own process, no temporary folder of the failed run either.
    assert list(private_tmp.iterdir()) == []


@pytest.fixture
def unwritable_outs(tmp_path: Path) -> Iterator[list[tuple[Path, str]]]:
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    foreign = tmp_path / "photos"
    foreign.mkdir()
    (foreign / "holiday.jpg").write_bytes(b"\xff\xd8")
    yield [
        (a_file / "out", "cannot write calibration output"),  # a file where a folder must be
        (a_file, "exists and is not a folder"),
        (foreign, "not a calibration output"),  # never replace a folder we did not write
        (Path("/proc/edge-agent-out"), "cannot write calibration output"),
    ]
    assert (foreign / "holiday.jpg").read_bytes() == b"\xff\xd8"


def test_calibrate_refuses_an_unwritable_out_before_any_work(
    samples: Path, unwritable_outs: list[tuple[Path, str]]
) -> None:
    for out, words in unwritable_outs:
        started = time.perf_counter()
        proc = cli("calibrate", "--model", "person-ssdlite", "--data", str(samples / "images"),
                   "--out", str(out))  # fmt: skip
        elapsed = time.perf_counter() - started
        assert proc.returncode == 2, (out, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1, proc.stderr  # one line, no traceback, no NNCF bars
        assert lines[0].startswith("edge-agent: error:")
        assert words in lines[0]
        assert proc.stdout == ""
        # Interpreter start-up only: it used to fail after all the quantization work.
        assert elapsed < 10, elapsed


def test_calibrate_refuses_a_calibrated_model_before_reading_its_data(tmp_path: Path) -> None:
    # The refusal came from the calibrator, after every sample was decoded: an hour of
    # audio or a day's captures read, for an answer the manifest gave at once.
    reference = json.loads(cli("models", "info", "vad-silero").stdout)
    model = tmp_path / "model.onnx"
    model.write_bytes(Path(reference["path"]).read_bytes())
    manifest = (REPO / "models" / "vad-silero.toml").read_text()
    (tmp_path / "model.toml").write_text(
        manifest + '\n[quantization]\nmode = "weights-int8"\nmetric = "vad-f1"\n'
        "metric_before = 1.0\nmetric_after = 1.0\nmax_drop = 0.01\nsamples = 8\n"
        'speedup = 1.1\nreport = "model.report.json"\n'
    )
    empty = tmp_path / "no-audio"  # read first, it failed "no WAV files", not the refusal
    empty.mkdir()
    started = time.perf_counter()
    proc = cli("calibrate", "--model", str(model), "--data", str(empty),
               "--out", str(tmp_path / "out"))  # fmt: skip
    elapsed = time.perf_counter() - started
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "is already calibrated (weights-int8)" in lines[0]
    assert "calibrate the FP32 model it came from" in lines[0]
    assert not (tmp_path / "out").exists()
    assert elapsed < 10, elapsed  # interpreter start-up only: NNCF is not even imported


def test_calibrate_from_a_pipelines_capture(catalog: Catalog, tmp_path: Path) -> None:
    # What is under test is the way from a pipeline's captures to a calibrated model, the
    # same for any model: face-blazeface's (the walker's face is big enough for its gate)
    # takes seconds where person-ssdlite's takes ten, and person_cli runs that one.
    video = write_walk(tmp_path / "walk.avi", empty=20, crossing=30)
    spec = PipelineSpec(
        id="dock-cam",
        model=ModelRef(name="face-blazeface"),
        source=FileSourceSpec(path=video.path),
        sinks=[CaptureSinkSpec(frames=24, min_interval_s=0.0, seed=7)],
    )
    layout = Layout(cache=catalog.cache, state=tmp_path / "state")
    handle = PipelineHandle(spec, ModelPool(catalog), layout=layout)
    try:
        handle.run()
    finally:
        handle.close()
    # Captures live in the state folder, and calibration reads them from there.
    captured = sorted(layout.captures("dock-cam").glob("slot-*.jpg"))
    assert len(captured) == 24
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(
        f"bench_seconds = {BENCH_S}\n" + (RECIPES / "face-blazeface.toml").read_text()
    )
    env = {**os.environ, "EDGE_AGENT_STATE_DIR": str(layout.state)}
    out = tmp_path / "q"
    proc = cli("calibrate", "--model", "face-blazeface", "--data", "pipeline:dock-cam",
               "--recipe", str(recipe), "--out", str(out), "--json", env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)  # stdout is the one JSON object, nothing else
    for key in ("metric", "metric_before", "metric_after", "throughput_before",
                "throughput_after", "speedup", "samples", "mode", "precision_before"):  # fmt: skip
        assert key in report, key
    assert report["samples_available"] == 24
    assert report["precision_before"] == "f32"
    assert report["mode"] == "int8"
    assert report["path"] == str(out / "model.xml")
    assert Path(report["path"]).is_file()
    assert "Statistics collection" in proc.stderr
