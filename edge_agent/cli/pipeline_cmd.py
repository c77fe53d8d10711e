"""`edge-agent run-pipeline`: run pipelines locally, live display or JSON lines.

Data goes to stdout (the spec's stdout sink, or one JSON line per frame with
--json, never both); tables and the start lines go to stderr. SIGINT and
SIGTERM stop every pipeline through its stop path, print the summaries so far
and exit 130 or 143.

Several specs run in one process (`pipelines.multi.PipelineGroup`): pipelines on
one model share it. With --json the summary is one line per pipeline, in the
order the specs were given, each `{"summary", "compile", "source"[, "signal"]}`:
the same line a single pipeline prints, so a reader handles one or many alike.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edge_agent.cli.common import (
    BACKEND_HELP,
    DEVICE_HELP,
    PRECISION_HELP,
    catalog,
    layout,
    positive_int,
    require_writable,
)
from edge_agent.config_files import first_error
from edge_agent.errors import EdgeAgentError

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from edge_agent.paths import Layout
    from edge_agent.pipelines.base import Sink
    from edge_agent.pipelines.multi import Outcome, PipelineGroup
    from edge_agent.pipelines.runner import PipelineHandle
    from edge_agent.pipelines.spec import AnySourceSpec, PipelineSpec
    from edge_agent.runtime.base import CompileReport
    from edge_agent.telemetry.stats import PipelineStats


def register(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "run-pipeline",
        help="run pipelines from spec files, or one from --model and --source",
        description="Run pipelines until their sources end, --max-frames, or Ctrl-C/SIGTERM "
        "(which stop them cleanly and print the summaries so far; exit 130/143). Several "
        "specs run in one process, sharing a model where they name the same one. Results go "
        "to stdout, tables to stderr. With specs, --model is not allowed and the model "
        "options given here override every spec's.",
    )
    parser.add_argument(
        "spec",
        nargs="*",
        type=Path,
        help="pipeline specs (.toml or .json), each with its own id; see the README",
    )
    parser.add_argument("--model", help="model name or file (instead of a spec)")
    parser.add_argument(
        "--source",
        help="video file, image folder, .wav, rtsp/http URL, /dev/videoN, or mic[:DEVICE] "
        "(instead of a spec)",
    )
    # No argparse defaults here: an option left out keeps the spec's value.
    parser.add_argument("--device", help=DEVICE_HELP + " (default: CPU, or the spec's)")
    parser.add_argument(
        "--backend",
        choices=["openvino", "onnxruntime"],
        help=BACKEND_HELP + " (default: openvino, or the spec's)",
    )
    parser.add_argument(
        "--hint",
        choices=["latency", "throughput"],
        help="OpenVINO performance hint (default: throughput, or the spec's)",
    )
    parser.add_argument(
        "--precision",
        choices=["f32", "bf16", "f16"],
        help=PRECISION_HELP + " (default: the spec's)",
    )
    parser.add_argument(
        "--max-frames",
        type=positive_int,
        help="stop after this many frames or audio windows (default: run to the end)",
    )
    parser.add_argument(
        "--no-telemetry", action="store_true", help="skip the per-stage latency histograms"
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="one JSON line per frame on stdout, then one summary line per pipeline (with "
        "the compile report); a spec's own stdout sink is not doubled",
    )
    parser.set_defaults(run=run)


def source_from_text(text: str) -> AnySourceSpec:
    """The CLI's --source: audio by suffix or `mic[:DEVICE]`, anything else is video."""
    from pydantic import ValidationError

    from edge_agent.pipelines.audio_sources import MicSourceSpec, WavSourceSpec
    from edge_agent.pipelines.sources import spec_from_uri

    if text == "mic" or text.startswith("mic:"):
        try:
            return MicSourceSpec(device=text.partition(":")[2] or "default")
        except ValidationError as exc:
            raise EdgeAgentError(
                f"invalid --source {text!r}: {first_error(exc)[1]}",
                "name the microphone as `arecord -L` lists it, e.g. --source mic:hw:1,0",
                code="input.invalid",
            ) from None
    if text.lower().endswith((".wav", ".wave")):
        return WavSourceSpec(path=Path(text))
    try:
        return spec_from_uri(text)
    except ValidationError as exc:
        # Not quoted: a stream URL may hold the camera's password.
        raise EdgeAgentError(
            f"invalid --source: {first_error(exc)[1]}",
            "give a camera index or /dev/videoN, a stream URL, a folder or a video file",
            code="input.invalid",
        ) from None


def build_specs(args: argparse.Namespace) -> list[PipelineSpec]:
    """The specs to run: the files', with the command line's overrides, validated whole."""
    from edge_agent.pipelines.spec import load_spec

    if args.spec:
        if args.model or args.source:
            raise EdgeAgentError(
                "give spec files or --model/--source, not both",
                "drop --model/--source, or the spec files",
                code="input.invalid",
            )
        return [_with_overrides(args, load_spec(p).model_dump(), str(p)) for p in args.spec]
    if args.model and args.source:
        base: dict[str, Any] = {"id": "cli", "model": {"name": args.model}, "sinks": []}
        base["source"] = source_from_text(args.source)
        return [_with_overrides(args, base, "the command line")]
    raise EdgeAgentError(
        "nothing to run",
        "pass spec files, or both --model NAME and --source FILE|URL",
        code="input.invalid",
    )


def _with_overrides(args: argparse.Namespace, base: dict[str, Any], where: str) -> PipelineSpec:
    from pydantic import ValidationError

    from edge_agent.pipelines.spec import PipelineSpec

    model_opts = {
        k: getattr(args, k)
        for k in ("device", "backend", "hint", "precision")
        if getattr(args, k) is not None
    }
    base["model"] = {**base["model"], **model_opts}
    if args.max_frames is not None:
        base["max_frames"] = args.max_frames
    if args.no_telemetry:
        base["telemetry"] = False
    try:
        # Validated again whole: model_copy(update=...) would let a bad override through.
        return PipelineSpec.model_validate(base)
    except ValidationError as exc:
        field, message = first_error(exc)
        raise EdgeAgentError(
            f"invalid pipeline from {where}: {field}: {message}",
            "fix that value; see `edge-agent run-pipeline --help`",
            code="config.invalid",
        ) from None


def writes_stdout(path: Path | None) -> bool:
    return path is None or str(path) in ("-", "/dev/stdout", "/proc/self/fd/1")


def check_outputs(spec: PipelineSpec, places: Layout) -> None:
    """Every folder the pipeline will write to, checked before the model is compiled."""
    from edge_agent.pipelines.capture import CaptureSinkSpec
    from edge_agent.pipelines.confine import refuse_protected
    from edge_agent.pipelines.sinks import JsonLinesSinkSpec

    # A sink in the store damages it as surely from here as from a command.
    refuse_protected(spec, places.owned(), code="config.invalid", writes_only=True)
    require_writable(places.cache, "model cache", "--cache-dir")
    for sink in spec.sinks:
        if isinstance(sink, JsonLinesSinkSpec):
            if writes_stdout(sink.path):
                continue
            assert sink.path is not None
            if sink.path.is_dir():
                raise EdgeAgentError(
                    f"the jsonl sink's path {sink.path} is a folder",
                    "give the sink a file path, e.g. results.jsonl",
                    code="sink.failed",
                )
            require_writable(sink.path.parent, "jsonl sink's folder", "the sink's path")
        elif isinstance(sink, CaptureSinkSpec):
            folder = sink.folder or places.captures(spec.id)
            flag = "the sink's folder" if sink.folder else "--state-dir"
            require_writable(folder, "capture folder", flag)
        else:
            require_writable(sink.folder, f"{sink.type} sink's folder", "the sink's folder")


def run(args: argparse.Namespace) -> int:
    from edge_agent.cli.report import start_line
    from edge_agent.cli.stopping import exit_code, exit_on_signals
    from edge_agent.pipelines.multi import PipelineGroup
    from edge_agent.pipelines.sinks import JsonLinesSink, JsonLinesSinkSpec
    from edge_agent.runtime.pool import ModelPool

    specs = build_specs(args)
    places = layout(args)
    for spec in specs:
        check_outputs(spec, places)

    def to_stdout(spec: PipelineSpec) -> bool:
        return any(isinstance(s, JsonLinesSinkSpec) and writes_stdout(s.path) for s in spec.sinks)

    def extra(spec: PipelineSpec) -> list[Sink]:
        # One line per frame: --json adds a stdout sink only where the spec has none.
        return [JsonLinesSink(sys.stdout)] if args.json and not to_stdout(spec) else []

    with exit_on_signals(sorted({spec.model.backend for spec in specs})):
        group = PipelineGroup(specs, ModelPool(catalog(args)), extra, layout=places)
    handles = list(group.handles)
    try:
        for handle in handles:
            line = start_line(handle.spec.model.name, handle.model.report)
            if len(handles) > 1:
                line = line.replace("edge-agent: ", f"edge-agent: {handle.spec.id}: ", 1)
            print(line, file=sys.stderr, flush=True)
            decoding = source_text(handle)
            if decoding:
                print(f"edge-agent: {handle.spec.id}: {decoding}", file=sys.stderr, flush=True)
        # A live table needs a terminal of its own: not a pipe, and not the one data scrolls in.
        data_on_tty = (args.json or any(map(to_stdout, specs))) and sys.stdout.isatty()
        live = not args.json and sys.stderr.isatty() and not data_on_tty
        outcomes, signum = _run_live(group) if live else _run_plain(group)
    finally:
        group.close()
    for handle, outcome in zip(handles, outcomes, strict=True):
        report = handle.model.report
        if args.json:
            summary: dict[str, Any] = {
                "summary": outcome.stats.model_dump(mode="json"),
                "compile": report.model_dump(mode="json"),
                "source": source_state(handle),
            }
            if signum is not None:
                summary["signal"] = signal.Signals(signum).name
            print(json.dumps(summary), flush=True)
        else:
            _stderr_console().print(render(outcome.stats, "summary", report))
    failed = [(h.spec.id, o.error) for h, o in zip(handles, outcomes, strict=True) if o.error]
    if failed:
        pipeline, error = failed[0]
        others = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        raise EdgeAgentError(
            f"pipeline {pipeline} stopped{others}: {error.problem}",
            error.fix or "see the log above",
            code=error.code,
        )
    if signum is not None:
        name = signal.Signals(signum).name
        frames = sum(o.stats.frames for o in outcomes)
        print(f"edge-agent: stopped by {name} after {frames} frames", file=sys.stderr)
        return exit_code(signum)
    lost = [(h.spec.id, o.stats.sink_failures) for h, o in zip(handles, outcomes, strict=True)]
    lost = [(pipeline, count) for pipeline, count in lost if count]
    if lost:
        # The frames ran, but results were lost on the way out (a full disk, a closed pipe):
        # a script must not take that run for a good one.
        pipeline, count = lost[0]
        raise EdgeAgentError(
            f"pipeline {pipeline} could not write {count} results to its sinks",
            "check the sinks' paths and their disk; the log above says which failed",
            code="sink.failed",
        )
    return 0


def source_state(handle: PipelineHandle) -> dict[str, Any]:
    """What the summary says of a pipeline's source: how it decodes, what it played."""
    source = getattr(handle.pipeline, "source", None)
    state: dict[str, Any] = {"type": handle.spec.source.type}
    decoding = getattr(source, "decoding", None)
    if decoding is not None:
        state.update(decode=decoding.hw, scale=decoding.scale, note=decoding.note)
    for counter in ("dropped", "played", "capped", "loops"):
        value = getattr(source, counter, None)
        if isinstance(value, int):
            state[counter] = value
    return state


def source_text(handle: PipelineHandle) -> str:
    """'decode on cpu at 1/2 (hw decode: none available, decoding on CPU)', or '' when
    the source decodes as asked, whole (a stream only knows once it is connected)."""
    decoding = getattr(getattr(handle.pipeline, "source", None), "decoding", None)
    if decoding is None or not (decoding.note or decoding.scale > 1):
        return ""
    return str(decoding.text())


def _run_plain(group: PipelineGroup) -> tuple[list[Outcome], int | None]:
    from edge_agent.cli.stopping import run_until_stopped

    return run_until_stopped(group.run, group.stop)


def _run_live(group: PipelineGroup) -> tuple[list[Outcome], int | None]:
    from rich.console import Group
    from rich.live import Live

    from edge_agent.cli.stopping import run_until_stopped

    reports = [h.model.report for h in group.handles]
    with Live(console=_stderr_console(), refresh_per_second=4, transient=True) as live:

        def tick() -> None:
            tables = [
                render(stats, "live", report)
                for stats, report in zip(group.snapshot(), reports, strict=True)
            ]
            live.update(Group(*tables))

        return run_until_stopped(group.run, group.stop, tick)


def _stderr_console() -> Console:
    from rich.console import Console

    return Console(stderr=True)


def render(stats: PipelineStats, title: str, report: CompileReport | None = None) -> Table:
    from rich.table import Table

    from edge_agent.cli.report import fallbacks_text, precision_text

    counts = f"{stats.frames} frames, {stats.fps:.1f} FPS, {stats.dropped} dropped"
    if stats.sink_failures or stats.frame_failures:
        counts += f", {stats.frame_failures} failed frames, {stats.sink_failures} sink failures"
    caption = None
    if report is not None:
        caption = f"{report.backend} {report.device}, {precision_text(report)}"
        if report.fallbacks:
            caption += f"\n[yellow]asked for {report.requested}: {fallbacks_text(report)}[/]"
    table = Table(title=f"{stats.pipeline} {title}: {counts}", caption=caption)
    for column in ("stage", "p50 ms", "p95 ms", "p99 ms", "max ms"):
        table.add_column(column, justify="right" if column != "stage" else "left")
    for name, s in stats.stages.items():
        if s.count:
            table.add_row(
                name, f"{s.p50_ms:.2f}", f"{s.p95_ms:.2f}", f"{s.p99_ms:.2f}", f"{s.max_ms:.2f}"
            )
    return table
