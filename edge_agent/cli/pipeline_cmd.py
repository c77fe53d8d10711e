"""`edge-agent run-pipeline`: run a pipeline locally, live display or JSON lines."""

from __future__ import annotations

import argparse
import json
import sys
import threading
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from edge_agent.cli.common import catalog
from edge_agent.errors import EdgeAgentError
from edge_agent.pipelines.audio_sources import MicSourceSpec, WavSourceSpec
from edge_agent.pipelines.base import Sink
from edge_agent.pipelines.runner import PipelineHandle
from edge_agent.pipelines.sinks import JsonLinesSink
from edge_agent.pipelines.sources import spec_from_uri
from edge_agent.pipelines.spec import AnySourceSpec, ModelRef, PipelineSpec, load_spec
from edge_agent.runtime.pool import ModelPool
from edge_agent.telemetry.stats import PipelineStats


def register(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "run-pipeline", help="run a pipeline from a spec file, or from --model and --source"
    )
    parser.add_argument("spec", nargs="?", type=Path, help="pipeline spec (.toml or .json)")
    parser.add_argument("--model", help="model name or path (instead of a spec)")
    parser.add_argument(
        "--source", help="video file, image folder, .wav, rtsp/http URL, /dev/videoN or mic"
    )
    parser.add_argument("--device", default="CPU")
    parser.add_argument("--backend", default="openvino", choices=["openvino", "onnxruntime"])
    parser.add_argument("--hint", default="throughput", choices=["latency", "throughput"])
    parser.add_argument("--precision", default=None, choices=["f32", "bf16", "f16"])
    parser.add_argument("--max-frames", type=int, default=None)
    parser.add_argument("--no-telemetry", action="store_true", help="skip stage histograms")
    parser.add_argument(
        "--json", action="store_true", help="one JSON line per frame, then a summary line"
    )
    parser.set_defaults(run=run)


def source_from_text(text: str) -> AnySourceSpec:
    """The CLI's --source: audio by suffix or `mic[:DEVICE]`, anything else is video."""
    if text == "mic" or text.startswith("mic:"):
        return MicSourceSpec(device=text.partition(":")[2] or "default")
    if text.lower().endswith((".wav", ".wave")):
        return WavSourceSpec(path=Path(text))
    return spec_from_uri(text)


def build_spec(args: argparse.Namespace) -> PipelineSpec:
    if args.spec is not None:
        if args.model or args.source:
            raise EdgeAgentError("give a spec file or --model/--source, not both")
        spec = load_spec(args.spec)
        if args.max_frames is not None:
            spec = spec.model_copy(update={"max_frames": args.max_frames})
        return spec
    if not (args.model and args.source):
        raise EdgeAgentError(
            "nothing to run", "pass a spec file, or both --model NAME and --source FILE|URL"
        )
    return PipelineSpec(
        id="cli",
        model=ModelRef(
            name=args.model,
            backend=args.backend,
            device=args.device,
            hint=args.hint,
            precision=args.precision,
        ),
        source=source_from_text(args.source),
        sinks=[],
        max_frames=args.max_frames,
        telemetry=not args.no_telemetry,
    )


def run(args: argparse.Namespace) -> int:
    spec = build_spec(args)
    extra: list[Sink] = [JsonLinesSink(sys.stdout)] if args.json else []
    handle = PipelineHandle(spec, ModelPool(catalog(args)), extra_sinks=extra)
    try:
        if args.json:
            stats = handle.run()
            print(json.dumps({"summary": stats.model_dump(mode="json")}), flush=True)
        else:
            stats = _run_live(handle)
            Console().print(render(stats, "summary"))
    finally:
        handle.close()
    error = handle.pipeline.error
    if error is not None:
        raise EdgeAgentError(f"pipeline {spec.id} stopped: {error.problem}", error.fix)
    return 0


def _run_live(handle: PipelineHandle) -> PipelineStats:
    box: list[PipelineStats] = []
    worker = threading.Thread(target=lambda: box.append(handle.run()), daemon=True)
    worker.start()
    console = Console(stderr=True)
    try:
        with Live(console=console, refresh_per_second=4, transient=True) as live:
            while worker.is_alive():
                live.update(render(handle.telemetry.snapshot(), "live"))
                worker.join(0.25)
    except KeyboardInterrupt:
        handle.stop()
        worker.join()
    if not box:
        raise EdgeAgentError("the pipeline ended without a result; see the log above")
    return box[0]


def render(stats: PipelineStats, title: str) -> Table:
    table = Table(
        title=f"{stats.pipeline} {title}: {stats.frames} frames, {stats.fps:.1f} FPS, "
        f"{stats.dropped} dropped"
    )
    for column in ("stage", "p50 ms", "p95 ms", "p99 ms", "max ms"):
        table.add_column(column, justify="right" if column != "stage" else "left")
    for name, s in stats.stages.items():
        if s.count:
            table.add_row(
                name, f"{s.p50_ms:.2f}", f"{s.p95_ms:.2f}", f"{s.p99_ms:.2f}", f"{s.max_ms:.2f}"
            )
    return table
