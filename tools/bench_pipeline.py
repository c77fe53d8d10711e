"""How fast `edge-agent run-pipeline` runs person-ssdlite on a video file, against its references.

In one run, on the CPU, over one 640x480 30 fps MJPG video built from scikit-image photos (the
astronaut walking across the coffee scene of edge_agent/clips.py, `--frames` long):

1. decode only: a `cv2.VideoCapture` read loop over the file, to show decoding is not the limit;
2. the pipeline, `edge-agent run-pipeline --model person-ssdlite --source VIDEO --json
   --hint throughput`, with telemetry and with `--no-telemetry`, alternately, `--rounds` times;
   the figures are the medians of the rounds (FPS, and the stage latencies of the final summary);
3. the pipeline under `--hint latency`, once, for its p95 end-to-end latency;
4. OpenVINO's `benchmark_app` on the same model file and shape [1,300,300,3], fed frames of the
   same video (the SSD's NMS runs inside the graph, so random inputs run at another speed), with
   `-hint throughput` every round and `-hint latency` once;
5. the naive loop a user writes by hand, in this process: read a frame, `cv2.resize` to 300x300,
   BGR -> RGB, a synchronous `compiled(x[None])` on a model compiled with no config, then the
   SSD outputs thresholded and scaled to the frame;
6. the pipeline on the same frames as uncompressed video (`--hint throughput`, in the rounds):
   frames read with a colour conversion and no decode, as from a camera that sends raw frames.
   Against `benchmark_app` it is the pipeline's own cost; against 2, what decoding MJPEG on
   the CPU costs;
7. ONNX Runtime where the model allows: person-ssdlite is a TF frozen graph ONNX Runtime cannot
   read, so it is skipped with the reason, and the ONNX model text-orientation runs through the
   pipeline on each backend over the same video instead, once each.

It prints every figure beside the precision it ran at and the load average, and the ratios
the pipeline is held to: pipeline / benchmark_app throughput >= 0.9, pipeline / naive loop
>= 1.7 and telemetry cost (FPS with telemetry off minus on, over off) <= 2%; the p95
end-to-end latency under the latency hint is reported without a target. A ratio whose rounds
disagree by more than 15% is flagged noisy. The reference loops live in
tools/pipeline_refs.py. The default run takes about 3 minutes.

Run it from the checkout, with the models already fetched:

    EDGE_AGENT_CACHE=/tmp/eacache python tools/bench_pipeline.py
    python tools/bench_pipeline.py --frames 900 --time 15 --rounds 3 --json out.json

Exit status: 0 when every figure was measured and every target met, 1 when a target was
missed, 2 when a measurement failed.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import openvino as ov
from benchlib import (
    MeasureError,
    Measurement,
    ModelUnderTest,
    Ratio,
    Run,
    Say,
    benchmark_app,
    consoles,
    describe,
    figure_table,
    finish,
    in_rounds,
    noisy,
    print_machine,
    quiet_home,
    ratio_of,
    ratio_table,
)
from pipeline_refs import (
    NaiveLoop,
    PipelineRun,
    decode_only,
    edge_agent_compile,
    run_pipeline,
    write_frames,
    write_raw,
)
from rich.table import Table

from edge_agent.clips import write_walk
from edge_agent.errors import EdgeAgentError

MODEL = "person-ssdlite"
ORT_MODEL = "text-orientation"
TARGET_VS_BENCHMARK_APP = 0.9
TARGET_VS_NAIVE = 1.7
TARGET_TELEMETRY_COST_PCT = 2.0

DECODE = "decode only (cv2)"
PIPE_ON = "pipeline OV throughput"
PIPE_OFF = "pipeline OV throughput --no-telemetry"
PIPE_LAT = "pipeline OV latency"
PIPE_RAW = "pipeline OV throughput, raw video"
BAPP = "benchmark_app throughput"
BAPP_LAT = "benchmark_app latency"
NAIVE = "naive loop"
PIPE_ORT = "pipeline ORT"
TEXT_OV = f"{ORT_MODEL} pipeline OV"
TEXT_ORT = f"{ORT_MODEL} pipeline ORT"
ROUND_KINDS = (PIPE_ON, PIPE_OFF, PIPE_RAW, BAPP, NAIVE)
ALL = (
    DECODE, PIPE_ON, PIPE_OFF, PIPE_RAW, PIPE_LAT, BAPP, BAPP_LAT, NAIVE, PIPE_ORT, TEXT_OV,
    TEXT_ORT,
)  # fmt: skip


def measure(
    model: ModelUnderTest,
    video: Path,
    raw: Path,
    frames: Path,
    home: str,
    seconds: int,
    rounds: int,
    say: Say,
) -> tuple[dict[str, Measurement], list[str]]:
    """Every measurement: the compared ones in rounds of alternating order, the rest once.

    Returns:
        The measurements, and what could not be learnt about them (which fails the run).
    """
    problems: list[str] = []
    ms = {name: Measurement(name) for name in ALL}
    if model.format != "onnx":
        ms[PIPE_ORT].skipped = (
            f"{model.name} is a {model.format} model, which ONNX Runtime cannot read; "
            f"{ORT_MODEL} (ONNX) compares the backends instead"
        )

    say("  decode only")
    ms[DECODE].attempt(lambda: decode_only(video), say)
    say("  precisions (a short edge-agent bench)")
    for name, target, backend in (
        (PIPE_ON, MODEL, "openvino"),
        (TEXT_OV, ORT_MODEL, "openvino"),
        (TEXT_ORT, ORT_MODEL, "onnxruntime"),
    ):
        try:
            ms[name].precision, ms[name].requests = edge_agent_compile(target, backend)
        except MeasureError as exc:
            # The FPS is still worth measuring; the missing precision fails the run.
            ms[name].precision = "unknown"
            problems.append(f"{name}: precision unknown: {exc}")
            say(f"[red]error:[/] {name}: {exc}")
    # run-pipeline --hint latency compiles at the device's default precision too.
    ms[PIPE_OFF].precision = ms[PIPE_LAT].precision = ms[PIPE_ON].precision
    ms[PIPE_RAW].precision = ms[PIPE_ON].precision
    ms[PIPE_OFF].requests = ms[PIPE_RAW].requests = ms[PIPE_ON].requests

    naive: NaiveLoop | None = None

    def naive_run() -> Run:
        nonlocal naive
        if naive is None:
            naive = NaiveLoop(model, video)
        return naive.run()

    steps: dict[str, Callable[[], Run]] = {
        PIPE_ON: lambda: run_pipeline(MODEL, video),
        PIPE_OFF: lambda: run_pipeline(MODEL, video, telemetry=False),
        PIPE_RAW: lambda: run_pipeline(MODEL, raw),
        BAPP: lambda: benchmark_app(model, seconds, None, home, inputs=frames),
        NAIVE: naive_run,
    }
    in_rounds(ms, steps, rounds, say)
    once: dict[str, Callable[[], Run]] = {
        PIPE_LAT: lambda: run_pipeline(MODEL, video, hint="latency"),
        BAPP_LAT: lambda: benchmark_app(model, seconds, None, home, "latency", frames),
        TEXT_OV: lambda: run_pipeline(ORT_MODEL, video),
        TEXT_ORT: lambda: run_pipeline(ORT_MODEL, video, backend="onnxruntime"),
    }
    for kind, step in once.items():
        say(f"  once: {kind}")
        ms[kind].attempt(step, say)
    return ms, problems


def ratios(ms: dict[str, Measurement]) -> list[Ratio]:
    """The targets, then the figures that explain them."""
    on, off, lat, bapp, naive = ms[PIPE_ON], ms[PIPE_OFF], ms[PIPE_LAT], ms[BAPP], ms[NAIVE]
    cost = None if on.fps is None or not off.fps else (off.fps - on.fps) / off.fps * 100
    found = [
        Ratio(f"{PIPE_ON} / {BAPP}", ratio_of(on, bapp), TARGET_VS_BENCHMARK_APP,
              noisy=noisy(on, bapp)),
        Ratio(f"{PIPE_ON} / {NAIVE}", ratio_of(on, naive), TARGET_VS_NAIVE,
              noisy=noisy(on, naive)),
        Ratio("telemetry cost (FPS off - on) / off", cost, TARGET_TELEMETRY_COST_PCT,
              at_least=False, unit="%", noisy=noisy(on, off)),
        Ratio("p95 end-to-end latency, latency hint", lat.median_of(lambda r: r.p95_ms),
              unit="ms"),
        Ratio(f"{DECODE} / {PIPE_ON}", ratio_of(ms[DECODE], on)),
        Ratio(f"{PIPE_RAW} / {BAPP}", ratio_of(ms[PIPE_RAW], bapp),
              noisy=noisy(ms[PIPE_RAW], bapp)),
        Ratio(f"{PIPE_ON} / {PIPE_RAW}", ratio_of(on, ms[PIPE_RAW]),
              noisy=noisy(on, ms[PIPE_RAW])),
    ]  # fmt: skip
    busy = on.median_run
    if isinstance(busy, PipelineRun) and {"read", "infer"} <= busy.stages.keys():
        # The caller's thread reads and submits: its own work per frame, times frames per second.
        prepare = busy.stages.get("preprocess")
        reader = busy.stages["read"].mean_ms + (prepare.mean_ms if prepare else 0.0)
        found.append(
            Ratio("reader thread busy: (read + preprocess) x FPS", reader * busy.fps / 10, unit="%")
        )
        if on.requests:
            engine = busy.stages["infer"].mean_ms * busy.fps / on.requests / 10
            found.append(
                Ratio(f"infer requests busy: infer x FPS / {on.requests}", engine, unit="%")
            )
    found.append(Ratio(f"{TEXT_OV} / {TEXT_ORT}", ratio_of(ms[TEXT_OV], ms[TEXT_ORT])))
    return found


def stage_table(ms: dict[str, Measurement]) -> Table:
    """The pipeline's stages, from the median round under each hint."""
    table = Table(
        title=f"{MODEL} pipeline stages, ms (the median round of each)",
        caption="thr: --hint throughput, lat: --hint latency; queue: waiting for a free infer "
        "request, plus the resize to the model's input (both in the reader's thread)",
        caption_justify="left",
    )
    table.add_column("stage")
    picked: list[PipelineRun | None] = []
    for name in (PIPE_ON, PIPE_LAT):
        run = ms[name].median_run
        picked.append(run if isinstance(run, PipelineRun) else None)
        for stat in ("p50", "p95", "p99", "mean"):
            table.add_column(f"{name.rsplit(' ', 1)[-1][:3]} {stat}", justify="right")
    names: list[str] = []
    for run in picked:
        names += [stage for stage in (run.stages if run else {}) if stage not in names]
    for stage in names:
        cells = [stage]
        for run in picked:
            s = run.stages.get(stage) if run else None
            values = (s.p50_ms, s.p95_ms, s.p99_ms, s.mean_ms) if s else (None,) * 4
            cells += ["—" if v is None else f"{v:.2f}" for v in values]
        table.add_row(*cells)
    return table


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--frames", type=int, default=600, help="frames in the test video")
    parser.add_argument(
        "--time",
        type=float,
        default=10.0,
        help="seconds of benchmark_app per hint, over all rounds",
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds, order reversed each time")
    parser.add_argument("--json", type=Path, default=None, help="write every figure here")
    args = parser.parse_args(argv)
    if args.frames < 1:
        parser.error("--frames must be 1 or more")
    rounds = max(1, args.rounds)
    # benchmark_app takes whole seconds.
    seconds = max(1, round(args.time / rounds))

    console, status = consoles(120)
    import onnxruntime

    report = print_machine(
        console, {"OpenVINO": ov.get_version(), "ONNX Runtime": onnxruntime.__version__}
    )
    console.print(
        f"{args.frames}-frame video; {rounds} round(s); benchmark_app {seconds} s per run"
    )
    report.update(frames=args.frames, rounds=rounds, benchmark_app_seconds=seconds)
    with tempfile.TemporaryDirectory(prefix="bench-pipeline-") as tmp:
        root = Path(tmp)
        video = root / "walk.avi"
        raw = root / "walk-raw.avi"
        frames = root / "frames"
        frames.mkdir()
        try:
            status.print(f"[bold]{MODEL}[/]")
            model = describe(MODEL)
            status.print(f"  writing {video.name}, {args.frames} frames")
            write_walk(video, frames=args.frames)
            write_frames(video, frames)
            write_raw(video, raw)
        except (MeasureError, EdgeAgentError) as exc:
            status.print(f"[red]error:[/] {exc}")
            return 2
        ms, problems = measure(
            model, video, raw, frames, quiet_home(root), seconds, rounds, status.print
        )
    found = ratios(ms)
    notes = [
        *problems,
        "p50/p95: pipelines, end_to_end stage (read to sink); benchmark_app, one inference; "
        "naive loop, one whole iteration; decode only, mean per frame",
        f"FPS: the median of the rounds; pipelines and the naive loop run the {args.frames}-frame "
        f"video, benchmark_app {seconds} s per run",
    ]
    title = f"{MODEL} (tf, 1x300x300x3) on CPU, 640x480 MJPG video"
    console.print(figure_table(title, list(ms.values()), notes))
    console.print(stage_table(ms))
    verdicts = f"{MODEL}: pipeline against its references ({rounds} round(s))"
    console.print(ratio_table(verdicts, found, notes=["x: median of the round-by-round ratios"]))
    report["figures"] = {m.name: m.to_json() for m in ms.values()}
    report["ratios"] = [r.to_json() for r in found]
    finish(console, report, args.json)
    if problems or any(m.error is not None for m in ms.values()):
        return 2
    return 1 if any(r.passed is False for r in found) else 0


if __name__ == "__main__":
    sys.exit(main())
