"""The entry point: calibrate a model on this device's data and write the result.

Kept as a function that takes a progress callback and returns a report as
data, so the agent's `calibrate` command can call it as the CLI does and send
progress responses; its output directory is a model version the store can take.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from edge_agent.bench import run_bench
from edge_agent.catalog.catalog import ResolvedModel
from edge_agent.catalog.manifest import Manifest, QuantizationInfo
from edge_agent.quantize.calibrate import CalibrationData, Calibrator, Progress, save_ir, versions
from edge_agent.quantize.recipe import CalibrationReport, Recipe
from edge_agent.runtime.base import RuntimeOptions
from edge_agent.runtime.openvino_backend import OpenVinoBackend

REPORT = "model.report.json"


def _throughput(
    path: Path, manifest: Manifest, device: str, precision: str | None, seconds: float
) -> tuple[float, str]:
    options = RuntimeOptions.model_validate(
        {"device": device, "hint": "throughput", "precision": precision}
    )
    model = OpenVinoBackend().compile(path, manifest, options)
    result = run_bench(model, manifest, seconds)
    return result.throughput_fps, model.report.precision


def calibrate(
    resolved: ResolvedModel,
    data: CalibrationData,
    recipe: Recipe,
    out: Path,
    device: str = "CPU",
    progress: Progress | None = None,
) -> tuple[Path | None, CalibrationReport]:
    """Compress `resolved` on `data` as `recipe` says, gate it, and write it to `out`.

    Returns:
        The path of the compressed model's IR (None when FP32 was kept) and the
        report, also written to `out/model.report.json`.
    """
    started = time.perf_counter()
    tell = progress or (lambda stage, done: None)
    calibrator = Calibrator(resolved, data, recipe, device, tell)
    model, rung, reason, rungs = calibrator.walk()
    out.mkdir(parents=True, exist_ok=True)
    base = resolved.manifest.model_copy(
        update={"format": "ir", "source": None, "quantization": None}
    )
    fp32_path = save_ir(calibrator.fp32, out / ".fp32")
    tell("benchmark", 0.0)
    seconds = recipe.bench_seconds
    before, _ = _throughput(fp32_path, base, device, "f32", seconds)
    default, default_precision = _throughput(fp32_path, base, device, None, seconds)
    winner_path: Path | None = None
    after = before
    size_after = fp32_path.with_suffix(".bin").stat().st_size
    if rung != "fp32":
        winner_path = save_ir(model, out)
        after, _ = _throughput(winner_path, base, device, None, seconds)
        size_after = winner_path.with_suffix(".bin").stat().st_size
    tell("benchmark", 1.0)
    winning = next(r for r in reversed(rungs) if r.rung == rung)
    report = CalibrationReport(
        model=resolved.manifest.name,
        recipe=recipe,
        mode=rung,
        reason=reason,
        rungs=rungs,
        metric=calibrator.task.metric,
        metric_before=1.0,
        metric_after=winning.metric_after,
        max_drop=recipe.max_drop,
        samples=calibrator.samples,
        holdout_samples=len(calibrator.task.holdout),
        samples_available=data.count,
        device=device,
        precision_before="f32",
        default_precision=default_precision,
        throughput_before=before,
        throughput_default=default,
        throughput_after=after,
        speedup=after / before if before else 0.0,
        speedup_vs_default=after / default if default else 0.0,
        size_before=fp32_path.with_suffix(".bin").stat().st_size,
        size_after=size_after,
        duration_s=time.perf_counter() - started,
        versions=versions(),
    )
    for leftover in (out / ".fp32").iterdir():
        leftover.unlink()
    (out / ".fp32").rmdir()
    (out / REPORT).write_text(json.dumps(report.model_dump(mode="json"), indent=2))
    if winner_path is not None:
        manifest = base.model_copy(
            update={
                "quantization": QuantizationInfo(
                    mode=rung,
                    metric=report.metric,
                    metric_before=report.metric_before,
                    metric_after=report.metric_after,
                    max_drop=report.max_drop,
                    samples=report.samples,
                    speedup=report.speedup,
                    report=REPORT,
                )
            }
        )
        _write_manifest(manifest, winner_path.with_suffix(".toml"))
    return winner_path, report


def _write_manifest(manifest: Manifest, path: Path) -> None:
    """Write a manifest as TOML (sidecar of the IR), so the runtime can load the model."""
    path.write_text(to_toml(manifest.model_dump(mode="json", exclude_none=True)))


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


def _key(key: str) -> str:
    return key if key.replace("-", "").replace("_", "").isalnum() else json.dumps(key)


def _value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")
