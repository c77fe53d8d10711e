"""The entry point: calibrate a model on this device's data and write the result.

Kept as a function that takes a progress callback and returns a report as
data, so the agent's `calibrate` command can call it as the CLI does and send
progress responses; its output directory is a model version the store can take:
`model.xml`/`.bin`, its manifest `model.toml` and `model.report.json`.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

from edge_agent.bench import run_bench
from edge_agent.catalog.catalog import ResolvedModel
from edge_agent.catalog.manifest import Manifest, QuantizationInfo, load_manifest
from edge_agent.quantize.calibrate import CalibrationData, Calibrator, Progress, save_ir, versions
from edge_agent.quantize.output import REPORT, begin_output, discard, publish
from edge_agent.quantize.recipe import CalibrationReport, Precision, Recipe
from edge_agent.runtime.base import RuntimeOptions
from edge_agent.runtime.openvino_backend import OpenVinoBackend

MODEL = "model.xml"
_WALK = 0.85
"""The share of a run's progress that the rungs take; the benchmarks take the rest."""


def _throughput(
    path: Path, manifest: Manifest, device: str, precision: Precision | None, seconds: float
) -> tuple[float, str]:
    options = RuntimeOptions.model_validate(
        {"device": device, "hint": "throughput", "precision": precision}
    )
    with OpenVinoBackend().compile(path, manifest, options) as model:
        result = run_bench(model, manifest, seconds)
        return result.throughput_fps, model.report.precision


def calibrate(
    resolved: ResolvedModel,
    data: CalibrationData,
    recipe: Recipe,
    out: Path,
    device: str = "CPU",
    progress: Progress | None = None,
) -> tuple[Path, CalibrationReport]:
    """Compress `resolved` on `data` as `recipe` says, gate it, and write it to `out`.

    `out` is built in a sibling folder and renamed into place only when complete,
    replacing a previous output whole; a failed run leaves `out` as it was.

    Returns:
        The path of the model's IR in `out` (the FP32 one, pinned to f32, when no faster
        rung passed) and the report, also written to `out/model.report.json`.

    Raises:
        EdgeAgentError: path.unwritable before any work when `out` cannot be written.
    """
    staging = begin_output(out)
    try:
        report = _calibrate_into(staging, resolved, data, recipe, device, progress)
        publish(staging, out)
    except BaseException:
        discard(staging)
        raise
    return out / MODEL, report


def _calibrate_into(
    staging: Path,
    resolved: ResolvedModel,
    data: CalibrationData,
    recipe: Recipe,
    device: str,
    progress: Progress | None,
) -> CalibrationReport:
    started = time.perf_counter()
    tell = progress or (lambda stage, done: None)
    # The walk's fractions fill the first part, the benchmarks the rest: on one scale, the
    # progress went back from the last rung's 0.75 to the benchmark's 0.
    calibrator = Calibrator(
        resolved, data, recipe, device, lambda stage, done: tell(stage, _WALK * done)
    )
    outcome = calibrator.walk()
    target = calibrator.device
    base = resolved.manifest.model_copy(
        update={"format": "ir", "source": None, "quantization": None, "precision": None}
    )
    compressed = outcome.model is not calibrator.fp32
    # The FP32 IR is the output itself when nothing was compressed; else a scratch copy
    # to measure the baseline, dropped before the output is published.
    fp32_path = save_ir(calibrator.fp32, staging / ".fp32" if compressed else staging)
    tell("benchmark", _WALK)
    seconds = recipe.bench_seconds
    before, _ = _throughput(fp32_path, base, target, "f32", seconds)
    default, default_precision = before, "f32"
    if calibrator.default_precision != "f32":
        default, default_precision = _throughput(fp32_path, base, target, None, seconds)
    size_before = fp32_path.with_suffix(".bin").stat().st_size
    winner_path, after, size_after = fp32_path, default, size_before
    if outcome.pinned == "f32":
        after = before
    if compressed:
        winner_path = save_ir(outcome.model, staging)
        after, _ = _throughput(winner_path, base, target, outcome.pinned, seconds)
        size_after = winner_path.with_suffix(".bin").stat().st_size
        shutil.rmtree(staging / ".fp32")
    tell("benchmark", 1.0)
    winning = outcome.rungs[-1]
    report = CalibrationReport(
        model=resolved.manifest.name,
        recipe=recipe,
        mode=outcome.rung,
        reason=outcome.reason,
        rungs=outcome.rungs,
        metric=calibrator.task.metric,
        metric_before=1.0,
        metric_after=winning.metric_after,
        max_drop=recipe.max_drop,
        samples=calibrator.samples,
        holdout_samples=len(calibrator.task.holdout),
        samples_available=data.count,
        device=target,
        precision=outcome.precision,
        precision_pinned=outcome.pinned,
        precision_before="f32",
        default_precision=default_precision,
        throughput_before=before,
        throughput_default=default,
        throughput_after=after,
        speedup=after / before if before else 0.0,
        speedup_vs_default=after / default if default else 0.0,
        size_before=size_before,
        size_after=size_after,
        duration_s=time.perf_counter() - started,
        versions=versions(),
    )
    (staging / REPORT).write_text(json.dumps(report.model_dump(mode="json"), indent=2))
    manifest = base.model_copy(
        update={
            "precision": outcome.pinned,
            "quantization": QuantizationInfo(
                mode=outcome.rung,
                metric=report.metric,
                metric_before=report.metric_before,
                metric_after=report.metric_after,
                max_drop=report.max_drop,
                samples=report.samples,
                speedup=report.speedup,
                report=REPORT,
            ),
        }
    )
    _write_manifest(manifest, winner_path.with_suffix(".toml"))
    return report


def _write_manifest(manifest: Manifest, path: Path) -> None:
    """Write a manifest as TOML (sidecar of the IR), so the runtime can load the model.

    Read back before the output is published: an output whose manifest does not load is
    a model no runtime can serve, and the CLI would have said it succeeded.
    """
    path.write_text(to_toml(manifest.model_dump(mode="json", exclude_none=True)), "utf-8")
    load_manifest(path)


def to_toml(data: dict[str, object], prefix: str = "") -> str:
    """A small TOML writer for manifests: scalars, lists, nested tables."""
    lines: list[str] = []
    tables: list[tuple[str, dict[str, object]]] = []
    for key, value in data.items():
        if isinstance(value, dict):
            tables.append((key, value))
        else:
            lines.append(f"{_key(key)} = {_value(value)}")
    text = "\n".join(lines) + ("\n" if lines else "")
    for key, table in tables:
        name = f"{prefix}{_key(key)}"
        text += f"\n[{name}]\n" + to_toml(table, name + ".")
    return text


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _key(key: str) -> str:
    # Not str.isalnum: it takes any Unicode letter, and TOML's bare keys are ASCII.
    return key if _BARE_KEY.fullmatch(key) else _string(key)


def _string(text: str) -> str:
    # Not json.dumps: it writes a character past U+FFFF as a surrogate pair (an emoji in a
    # description), which TOML refuses; and with ensure_ascii off it leaves DEL raw.
    escaped = []
    for ch in text:
        if ch in '"\\':
            escaped.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            escaped.append(f"\\u{ord(ch):04x}")
        else:
            escaped.append(ch)
    return '"' + "".join(escaped) + '"'


def _value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")
