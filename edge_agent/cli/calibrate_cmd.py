"""`edge-agent calibrate`: INT8 on this device's own data, gated on accuracy."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from edge_agent.catalog.manifest import AudioInput
from edge_agent.cli.common import catalog
from edge_agent.quantize.api import calibrate
from edge_agent.quantize.calibrate import CalibrationData
from edge_agent.quantize.data import load_clips, load_frames, resolve_data
from edge_agent.quantize.recipe import CalibrationReport, Recipe, load_recipe


def register(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "calibrate", help="quantize a model to INT8 on local data, gated on accuracy"
    )
    parser.add_argument("--model", required=True, help="reference model name or model file")
    parser.add_argument(
        "--data", required=True, help="image folder, video, WAV (or folder), or pipeline:<id>"
    )
    parser.add_argument(
        "--recipe", type=Path, help="recipe TOML (default: calibration/<model>.toml)"
    )
    parser.add_argument("--device", default="CPU", help="device to measure throughput on")
    parser.add_argument(
        "--out", type=Path, help="output folder (default: <cache>/calibrated/<model>)"
    )
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
    parser.set_defaults(run=run)


def default_recipe(model: str) -> Path:
    return Path(__file__).resolve().parents[2] / "calibration" / f"{model}.toml"


def run(args: argparse.Namespace) -> int:
    cat = catalog(args)
    resolved = cat.resolve(args.model)
    recipe_path = args.recipe or default_recipe(resolved.manifest.name)
    recipe = load_recipe(recipe_path) if recipe_path.is_file() or args.recipe else Recipe()
    source = resolve_data(args.data, cat.cache)
    spec = resolved.manifest.input
    if isinstance(spec, AudioInput):
        data = CalibrationData([], load_clips(source, spec.sample_rate))
    else:
        data = CalibrationData(load_frames(source, recipe.max_samples), [])
    out = args.out or cat.cache / "calibrated" / resolved.manifest.name
    console = Console(stderr=True)
    last = [""]

    def progress(stage: str, done: float) -> None:
        if stage != last[0]:
            console.print(f"[bold]calibrate[/] {resolved.manifest.name}: {stage}")
            last[0] = stage

    # NNCF draws its own progress bars on stdout; keep stdout for the JSON report.
    redirect = contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext()
    with redirect:
        path, report = calibrate(resolved, data, recipe, out, args.device, progress)
    if args.json:
        print(json.dumps(summary(report, path)))
    else:
        Console().print(render(report, path))
    return 0


def summary(report: CalibrationReport, path: Path | None) -> dict[str, Any]:
    """The report as one JSON object, with the output path."""
    return {**report.model_dump(mode="json"), "path": str(path) if path else None}


def render(report: CalibrationReport, path: Path | None) -> Table:
    table = Table(title=f"calibration of {report.model}: {report.mode}", show_header=False)
    table.add_row("result", report.reason)
    for rung in report.rungs:
        mark = "[green]pass[/]" if rung.passed else "[red]fail[/]"
        table.add_row(f"rung {rung.rung}", f"{mark} {rung.reason} ({rung.seconds:.1f} s)")
    table.add_row(
        "metric", f"{report.metric}: {report.metric_before:.4f} -> {report.metric_after:.4f}"
    )
    table.add_row("samples", f"{report.samples} calibration, {report.holdout_samples} held out "
                  f"(of {report.samples_available} read)")  # fmt: skip
    table.add_row(
        "throughput",
        f"f32 {report.throughput_before:.1f} FPS, default ({report.default_precision}) "
        f"{report.throughput_default:.1f} FPS, after {report.throughput_after:.1f} FPS",
    )
    table.add_row(
        "speedup", f"{report.speedup:.2f}x over f32, {report.speedup_vs_default:.2f}x over default"
    )
    table.add_row("size", f"{report.size_before / 1e6:.1f} MB -> {report.size_after / 1e6:.1f} MB")
    table.add_row("output", str(path) if path else "none (FP32 kept)")
    table.add_row("duration", f"{report.duration_s:.0f} s")
    return table
