"""The steps of tools/bench_quantize.py: sample sets, `edge-agent calibrate`, plain INT8 (the
ladder's first rung, ungated, through edge-agent's own Calibrator), and the rounds of
benchmark_app and edge-agent bench on every variant.

Each step raises MeasureError with one line when it cannot do its job.
"""

from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchlib import (
    BIN,
    MeasureError,
    Measurement,
    ModelUnderTest,
    Ratio,
    Run,
    Say,
    benchmark_app,
    describe,
    edge_agent_bench,
    in_rounds,
    load_1m,
    one_line,
    quiet_nncf,
)

REPO = Path(__file__).resolve().parents[1]
RECIPE_OVERRIDES = ("bench_seconds", "accuracy_iterations")
# The sample set each model calibrates on (build_samples.py's folders); images otherwise.
DATA = {"text-det-ppocr": "text"}
# Rungs that quantize activations too: the ones the INT8 speed target is about.
FULL_INT8_RUNGS = {"int8", "int8-scope", "int8-accuracy"}

BAPP_F32 = "benchmark_app f32"
BAPP_DEFAULT = "benchmark_app default"
BAPP_WINNER = "benchmark_app winner"
BAPP_INT8 = "benchmark_app INT8 plain"
EA_INT8 = "edge-agent INT8 plain"
EA_ORT = "edge-agent ORT f32"
KINDS = (BAPP_F32, BAPP_DEFAULT, BAPP_WINNER, BAPP_INT8, EA_INT8, EA_ORT)


@dataclass(frozen=True, slots=True)
class PlainInt8:
    """The ungated INT8 model and the FP32 IR it came from, as files."""

    fp32_ir: Path
    int8_ir: Path
    metric: str
    metric_after: float
    max_drop: float
    seconds: float

    @property
    def drop(self) -> float:
        return 1.0 - self.metric_after


def build_samples(out: Path) -> None:
    """calibration/build_samples.py --out OUT, once for every model."""
    argv = [sys.executable, str(REPO / "calibration" / "build_samples.py"), "--out", str(out)]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        detail = one_line(done.stderr or done.stdout)
        raise MeasureError(f"build_samples.py exited {done.returncode}: {detail}")


def recipe_copy(name: str, seconds: float, iterations: int, folder: Path) -> Path:
    """calibration/<name>.toml with bench_seconds and accuracy_iterations set on top.

    The two keys go first, before any [table], and replace the recipe's own top-level ones.
    """
    source = REPO / "calibration" / f"{name}.toml"
    kept: list[str] = []
    in_table = False
    for line in source.read_text().splitlines() if source.is_file() else []:
        in_table = in_table or re.match(r"\s*\[", line) is not None
        key = line.split("=", 1)[0].strip()
        if not in_table and "=" in line and key in RECIPE_OVERRIDES:
            continue
        kept.append(line)
    head = [
        f"# tools/bench_quantize.py: a copy of {source.name} with its timing set",
        f"bench_seconds = {float(seconds)!r}",
        f"accuracy_iterations = {iterations}",
    ]
    path = folder / f"{name}.toml"
    path.write_text("\n".join(head + kept) + "\n")
    return path


def run_calibrate(name: str, data: Path, recipe: Path, out: Path, say: Say) -> dict[str, Any]:
    """`edge-agent calibrate --json`; its stages are relayed as they start, its report parsed."""
    argv = [str(BIN / "edge-agent"), "calibrate", "--model", name, "--data", str(data)]
    argv += ["--recipe", str(recipe), "--out", str(out), "--json"]
    tail: collections.deque[str] = collections.deque(maxlen=20)
    with tempfile.TemporaryFile("w+") as stdout:
        try:
            proc = subprocess.Popen(argv, stdout=stdout, stderr=subprocess.PIPE, text=True)
        except OSError as exc:
            raise MeasureError(f"cannot run {argv[0]}: {exc.strerror}") from None
        for raw in proc.stderr or ():
            line = raw.strip()
            if line.startswith("calibrate "):
                say(f"    {line}")
            if line:
                tail.append(line)
        code = proc.wait()
        stdout.seek(0)
        text = stdout.read()
    if code != 0:
        detail = one_line("\n".join(tail))
        raise MeasureError(f"edge-agent calibrate exited {code}: {detail}")
    try:
        report: dict[str, Any] = json.loads(text.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        report = {}
    wanted = ("mode", "metric", "metric_after", "max_drop", "throughput_before",
              "throughput_default", "throughput_after", "default_precision")  # fmt: skip
    if not isinstance(report, dict) or any(key not in report for key in wanted):
        raise MeasureError(f"edge-agent calibrate printed no report: {one_line(text)}")
    return report


def quantize_plain(name: str, data: Path, recipe_path: Path, folder: Path) -> PlainInt8:
    """The ladder's first rung, ungated: NNCF INT8 with the recipe's ignored scope, as IR.

    Also writes the FP32 IR (at the manifest's input shape) it came from, and a manifest
    beside each, so `edge-agent bench --model FILE.xml` can run them.
    """
    # NNCF is slow to import and only this step needs it.
    from edge_agent.catalog.catalog import Catalog, default_models_dir
    from edge_agent.paths import Layout
    from edge_agent.quantize.api import to_toml
    from edge_agent.quantize.calibrate import Calibrator, save_ir
    from edge_agent.quantize.data import calibration_data
    from edge_agent.quantize.recipe import load_recipe

    started = time.perf_counter()
    try:
        recipe = load_recipe(recipe_path)
        resolved = Catalog(default_models_dir(), Layout.from_env(os.environ).cache).resolve(name)
        samples = calibration_data(data, resolved.manifest, recipe)
        with quiet_nncf():
            calibrator = Calibrator(resolved, samples, recipe, "CPU")
            model = calibrator.compress("int8")
            # Scored as it will serve: the device default precision.
            score, _, _ = calibrator.evaluate(model, None)
        fp32_ir = save_ir(calibrator.fp32, folder / "fp32")
        int8_ir = save_ir(model, folder / "int8")
    except Exception as exc:  # NNCF, OpenVINO and edge-agent each raise their own kinds
        raise MeasureError(f"plain INT8: {one_line(str(exc)) or type(exc).__name__}") from None
    manifest = resolved.manifest.model_copy(
        update={"format": "ir", "source": None, "quantization": None}
    )
    sidecar = to_toml(manifest.model_dump(mode="json", exclude_none=True))
    for ir in (fp32_ir, int8_ir):
        ir.with_suffix(".toml").write_text(sidecar)
    return PlainInt8(
        fp32_ir=fp32_ir,
        int8_ir=int8_ir,
        metric=calibrator.task.metric,
        metric_after=score,
        max_drop=recipe.max_drop,
        seconds=time.perf_counter() - started,
    )


@dataclass(slots=True)
class ModelResult:
    """Everything measured on one model."""

    name: str
    report: dict[str, Any] | None = None
    calibrate_error: str | None = None
    calibrate_seconds: float | None = None
    calibrate_load: float | None = None
    plain: PlainInt8 | None = None
    plain_error: str | None = None
    measurements: dict[str, Measurement] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return (
            self.calibrate_error is not None
            or self.plain_error is not None
            or any(m.error is not None for m in self.measurements.values())
        )


def measure(
    model: ModelUnderTest, result: ModelResult, seconds: int, rounds: int, home: str, say: Say
) -> None:
    """benchmark_app on every variant and edge-agent on the rest, alternating round by round."""
    ms = result.measurements = {kind: Measurement(kind) for kind in KINDS}
    plain, report = result.plain, result.report
    winner = report.get("path") if report is not None else None
    if report is None:
        ms[BAPP_WINNER].skipped = "calibrate failed"
    elif winner is None:
        ms[BAPP_WINNER].skipped = "no rung passed the gate: FP32 kept, the f32 rows apply"
    if plain is None:
        for kind in (BAPP_F32, BAPP_DEFAULT, BAPP_INT8, EA_INT8):
            ms[kind].skipped = "plain INT8 quantization failed"
    if model.format != "onnx":
        ms[EA_ORT].skipped = f"ONNX Runtime cannot read a {model.format} model"

    steps: dict[str, Callable[[], Run]] = {}
    if plain is not None:
        fp32, int8 = model.as_file(plain.fp32_ir), model.as_file(plain.int8_ir)
        steps[BAPP_F32] = lambda: benchmark_app(fp32, seconds, "f32", home)
        steps[BAPP_DEFAULT] = lambda: benchmark_app(fp32, seconds, None, home)
        steps[BAPP_INT8] = lambda: benchmark_app(int8, seconds, None, home)
        steps[EA_INT8] = lambda: edge_agent_bench(int8, "openvino", seconds, None)
    if winner is not None:
        won = model.as_file(Path(winner))
        steps[BAPP_WINNER] = lambda: benchmark_app(won, seconds, None, home)
    steps[EA_ORT] = lambda: edge_agent_bench(model, "onnxruntime", seconds, None)
    in_rounds(ms, {k: steps[k] for k in KINDS if k in steps}, rounds, say)


def bench_model(
    name: str,
    samples: Path,
    root: Path,
    accuracy_iterations: int,
    seconds: int,
    rounds: int,
    home: str,
    say: Say,
) -> tuple[ModelUnderTest, ModelResult]:
    """Calibrate, quantize plainly, then measure; raises MeasureError only if `name` is unusable."""
    model = describe(name)
    result = ModelResult(name)
    data = samples / DATA.get(name, "images")
    folder = root / name
    folder.mkdir()
    recipe = recipe_copy(name, float(seconds), accuracy_iterations, folder)
    say(f"  edge-agent calibrate ({data.name}, accuracy_iterations={accuracy_iterations})")
    started = time.perf_counter()
    try:
        result.report = run_calibrate(name, data, recipe, folder / "calibrated", say)
    except MeasureError as exc:
        result.calibrate_error = str(exc)
        say(f"[red]error:[/] {name}: {exc}")
    result.calibrate_seconds = time.perf_counter() - started
    result.calibrate_load = load_1m()
    say(f"  calibrate took {result.calibrate_seconds:.0f} s; plain INT8 (ungated)")
    try:
        result.plain = quantize_plain(name, data, recipe, folder / "plain")
    except MeasureError as exc:
        result.plain_error = str(exc)
        say(f"[red]error:[/] {name}: {exc}")
    measure(model, result, seconds, rounds, home, say)
    return model, result


def to_json(result: ModelResult, found: list[Ratio]) -> dict[str, Any]:
    plain = result.plain
    return {
        "calibrate_report": result.report,
        "calibrate_error": result.calibrate_error,
        "calibrate_seconds": result.calibrate_seconds,
        "calibrate_load": result.calibrate_load,
        "plain_int8": None
        if plain is None
        else {
            "metric": plain.metric,
            "metric_after": plain.metric_after,
            "drop": plain.drop,
            "max_drop": plain.max_drop,
            "seconds": plain.seconds,
        },
        "plain_int8_error": result.plain_error,
        "measurements": {m.name: m.to_json() for m in result.measurements.values()},
        "ratios": [r.to_json() for r in found],
    }
