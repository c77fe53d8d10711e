"""`edge-agent bench`: throughput and latency of one model on one device."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from edge_agent.cli.common import (
    add_runtime_args,
    catalog,
    layout,
    parse_shape,
    positive_float,
    require_writable,
    runtime_options,
)

if TYPE_CHECKING:
    from rich.table import Table

    from edge_agent.bench import BenchResult


def register(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "bench",
        help="measure throughput, latency percentiles, compile and first-inference time",
        description="Keep every infer request of one model busy with random input and measure.",
    )
    add_runtime_args(parser, default_hint="throughput")
    parser.add_argument(
        "--shape",
        default=None,
        help="input shape in the model's own layout, e.g. 1,3,640,640; a first dimension "
        "above 1 benches that batch where the model allows it (default: the manifest's)",
    )
    parser.add_argument(
        "--time", type=positive_float, default=10.0, help="seconds of timed inference"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from edge_agent.bench import run_bench
    from edge_agent.runtime import create_backend

    shape = parse_shape(args.shape)
    require_writable(layout(args).cache, "model cache", "--cache-dir")
    resolved = catalog(args).resolve(args.model)
    options = runtime_options(args, shape)
    with create_backend(args.backend).compile(resolved.path, resolved.manifest, options) as model:
        if args.json:
            result = run_bench(model, resolved.manifest, args.time)
            print(json.dumps(result.model_dump(mode="json")))
            return 0
        console = Console(stderr=True)
        with Progress(
            TextColumn("[bold]bench[/] {task.description}"),
            BarColumn(),
            TimeRemainingColumn(),
            console=console,
            transient=True,
        ) as bar:
            task = bar.add_task(resolved.manifest.name, total=1.0)
            result = run_bench(
                model, resolved.manifest, args.time, lambda f: bar.update(task, completed=f)
            )
    Console().print(render(result))
    return 0


def render(result: BenchResult) -> Table:
    from rich.table import Table

    from edge_agent.cli.report import fallbacks_text, precision_text

    c = result.compile
    table = Table(title=f"{result.model} on {c.backend} {c.device}", show_header=False)
    table.add_row("precision", precision_text(c))
    table.add_row("hint / requests", f"{c.hint} / {c.requests}")
    if c.fallbacks:
        table.add_row("fallbacks", fallbacks_text(c))
    shape = c.model_shape or next(iter(c.inputs.values()))
    table.add_row("input shape", "x".join(str(d) for d in shape))
    table.add_row(
        "compile", f"{c.compile_s * 1e3:.0f} ms" + (" (from cache)" if c.from_cache else "")
    )
    table.add_row("first inference", f"{result.first_inference_ms:.1f} ms")
    batch = f", batch {result.batch}" if result.batch > 1 else ""
    table.add_row(
        "throughput",
        f"{result.throughput_fps:.1f} FPS ({result.iterations} in {result.seconds:.1f} s{batch})",
    )
    lat = result.latency_ms
    table.add_row(
        "latency p50/p95/p99", f"{lat['p50']:.2f} / {lat['p95']:.2f} / {lat['p99']:.2f} ms"
    )
    return table
