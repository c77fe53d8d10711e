"""`edge-agent calibrate`: INT8 on this device's own data, gated on accuracy.

stdout carries only the result (the table, or one JSON object with --json);
progress lines and NNCF's bars and logs go to stderr, so the output can be piped.
NNCF and OpenVINO are imported when the command runs, not when the CLI starts.
"""

from __future__ import annotations

import argparse
import json
import logging
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.table import Table

    from edge_agent.catalog.catalog import ResolvedModel
    from edge_agent.quantize.calibrate import Progress
    from edge_agent.quantize.recipe import CalibrationReport

log = logging.getLogger(__name__)


def register(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "calibrate",
        help="quantize a model to INT8 on local data, gated on accuracy",
        description="Quantize a model to INT8 with NNCF on data from this box, and keep it "
        "only if its accuracy on held-out data stays within the recipe's max_drop of the "
        "original; a failed gate walks down to safer rungs of the recipe's ladder, ending "
        "on FP32.",
    )
    parser.add_argument("--model", required=True, help="reference model name or model file")
    parser.add_argument(
        "--data", required=True, help="image folder, video, WAV (or folder), or pipeline:<id>"
    )
    parser.add_argument(
        "--recipe", type=Path, help="recipe TOML (default: the model's reference recipe)"
    )
    parser.add_argument(
        "--device",
        default="CPU",
        help="device the model will run on: the gate scores and measures it there (default: CPU)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        help="output folder, replaced whole on success (default: <state>/calibrated/<model>)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from edge_agent.agent.records import recorded_spec
    from edge_agent.cli import launch
    from edge_agent.cli.common import catalog, layout
    from edge_agent.errors import EdgeAgentError
    from edge_agent.quantize.data import (
        calibration_data,
        recipe_for,
        refuse_calibrated,
        resolve_data,
    )
    from edge_agent.quantize.output import check_output
    from edge_agent.quantize.recipe import load_recipe

    # Every argument that can be wrong is checked before the model is fetched or a frame read.
    if args.out is not None:
        check_output(args.out)
    places = layout(args)
    source = resolve_data(args.data, places, partial(recorded_spec, places.agent))
    recipe = load_recipe(args.recipe) if args.recipe is not None else None
    resolved = catalog(args).resolve(args.model)
    refuse_calibrated(resolved)
    out: Path = args.out or places.calibrated / resolved.manifest.name
    if args.out is None:
        check_output(out)
    if recipe is None:
        recipe = recipe_for(resolved.manifest)
    from edge_agent.quiet import stdout_to_stderr

    with stdout_to_stderr():
        # NNCF and OpenVINO load here: seconds of imports the rest of the CLI does not pay.
        from edge_agent.quantize.api import calibrate
        from edge_agent.quantize.calibrate import first_line, precheck

        precheck(resolved, recipe, args.device)  # before the data: reading it takes minutes
        data = calibration_data(source, resolved.manifest, recipe)
        try:
            path, report = calibrate(resolved, data, recipe, out, args.device, _progress(resolved))
        except (EdgeAgentError, OSError):
            raise
        except Exception as exc:
            if launch.signalled():
                raise  # a Ctrl-C in disguise: run_command says so
            # Every failure inside a rung only fails that rung; what reaches here is a bug
            # outside the ladder, and an operator gets one line, not NNCF's stack.
            log.debug("event=calibrate_failed model=%s", resolved.manifest.name, exc_info=True)
            raise EdgeAgentError(
                f"calibration of {resolved.manifest.name} failed: {type(exc).__name__}: "
                f"{first_line(exc)}",
                "run again with -vv to log where, and report it as a bug",
                "calibration.failed",
            ) from exc
    if args.json:
        print(json.dumps(summary(report, path)), flush=True)
    else:
        from rich.console import Console

        Console().print(render(report, path))
    return 0


def _progress(resolved: ResolvedModel) -> Progress:
    from rich.console import Console

    console = Console(stderr=True)
    last = [""]

    def progress(stage: str, done: float) -> None:
        if stage != last[0]:
            console.print(f"[bold]calibrate[/] {resolved.manifest.name}: {stage}")
            last[0] = stage

    return progress


def summary(report: CalibrationReport, path: Path) -> dict[str, Any]:
    """The report as one JSON object, with the output model's path."""
    return {**report.model_dump(mode="json"), "path": str(path)}


def render(report: CalibrationReport, path: Path) -> Table:
    from rich.table import Table

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
        "precision",
        f"{report.precision} on {report.device}"
        + (" (pinned in the manifest)" if report.precision_pinned else " (device default)"),
    )
    table.add_row(
        "throughput",
        f"f32 {report.throughput_before:.1f} FPS, default ({report.default_precision}) "
        f"{report.throughput_default:.1f} FPS, after {report.throughput_after:.1f} FPS",
    )
    table.add_row(
        "speedup", f"{report.speedup:.2f}x over f32, {report.speedup_vs_default:.2f}x over default"
    )
    table.add_row("size", f"{report.size_before / 1e6:.1f} MB -> {report.size_after / 1e6:.1f} MB")
    table.add_row("output", str(path))
    table.add_row("duration", f"{report.duration_s:.0f} s")
    return table
