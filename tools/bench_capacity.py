"""How many 640x480 15 FPS camera streams this box runs person-ssdlite on, and how close that is
to the limit.

A stream "fits" when, over `--seconds` (default 60), none of N streams drops a frame and
every stream's p95 end-to-end latency (from a frame's due time to its result) is under
100 ms. The streams are realtime, looping file sources (`realtime = true, loop = true`): a
640x480 15 fps MJPG clip of edge_agent/clips.py played as a camera sends it, so the
question is asked the same way on every run. The streams play out of step, stream i a
fraction i/N of a frame interval after stream 0, as separate cameras on their own clocks
are (separate processes are out of step anyway): that is the question a buyer asks.
`--in-step` makes every stream's frame come due on the same tick instead, which no set of
real cameras does: the worst case for a burst, where N frames wait on one another at every
tick and the p95 grows with N. In one run it measures:

1. in one process (`PipelineGroup`, one shared compiled model): the largest N that fits,
   found by doubling N and then bisecting between the last N that fit and the first that
   did not;
2. N separate `edge-agent run-pipeline SPEC --json` processes at that N (what a user tries
   first), each compiling its own model and running its own engine threads, stopped with
   SIGINT after the same time;
3. the theoretical limit: OpenVINO's `benchmark_app -hint throughput` FPS on the model file,
   fed frames of the same clip (the SSD's NMS runs in the graph, so random data runs at
   another speed), over 15; measured before the search and again after it, and averaged,
   with a warning when the two differ by over 5% (a shared host's speed drifts).

Every figure is printed with the 1-minute load average when it was taken and the CPU flags.
Run it on a quiet machine; the figures mean little while anything else runs.

    python tools/bench_capacity.py                       # the full run, several minutes
    python tools/bench_capacity.py --seconds 3 --max-n 2 # a smoke run, seconds
    python tools/bench_capacity.py --codec raw           # cameras that send raw frames
    python tools/bench_capacity.py --start-n 16          # skip 1, 2, 4 and 8 streams
    python tools/bench_capacity.py --in-step             # every frame due on the same tick
    python tools/bench_capacity.py --model out/model.xml # the INT8 model calibrate wrote

Exit status: 0 when every figure was measured, 2 when a measurement failed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

import cv2
from benchlib import (
    BIN,
    MeasureError,
    benchmark_app,
    consoles,
    cpu_flags,
    describe,
    finish,
    flags_text,
    load_1m,
    one_line,
    print_machine,
    quiet_home,
)
from pipeline_refs import write_frames
from rich.table import Table

from edge_agent.catalog.catalog import Catalog, default_models_dir
from edge_agent.clips import compose, walk_positions
from edge_agent.pipelines.multi import PipelineGroup
from edge_agent.pipelines.sources import FileSourceSpec, RealtimeFileSource
from edge_agent.pipelines.spec import ModelRef, PipelineSpec
from edge_agent.runtime.pool import ModelPool

MODEL = "person-ssdlite"
"""The default model: any image model can be asked about (`--model`), a calibrated one too."""
FPS = 15.0
P95_LIMIT_MS = 100.0
DRIFT_NOTED = 0.05
"""benchmark_app before and after the search differing by more than this is printed."""
START_WAIT_S = 120.0
"""How long a separate process may take from its start to its first result (the compile)."""


@dataclass(frozen=True, slots=True)
class Trial:
    """N streams for a while: did they fit, and the figures that say why."""

    mode: str
    streams: int
    fits: bool
    fps: float
    """Frames per second over all streams."""
    dropped: int
    played: int
    p95_ms: float
    """The worst stream's p95 end-to-end latency."""
    load: float

    def row(self) -> list[str]:
        share = f"{self.dropped / self.played:.1%}" if self.played else "-"
        return [
            self.mode,
            str(self.streams),
            "yes" if self.fits else "no",
            f"{self.fps:.1f}",
            f"{self.dropped} ({share})",
            f"{self.p95_ms:.1f}",
            f"{self.load:.2f}",
        ]


def write_clip(path: Path, seconds: float = 8.0, codec: str = "mjpg") -> Path:
    """A 640x480 15 fps clip of the walk, `seconds` long (looped by the sources).

    codec "mjpg" is what an IP or USB camera sends compressed; "raw" is uncompressed 4:2:0
    (what OpenCV's FFmpeg writes for fourcc 0), read with a colour conversion and no
    decode, as from a USB camera in its raw (YUYV) mode.
    """
    fourcc = cv2.VideoWriter.fourcc(*"MJPG") if codec == "mjpg" else 0
    writer = cv2.VideoWriter(str(path), fourcc, FPS, (640, 480))
    if not writer.isOpened():
        raise MeasureError(f"OpenCV cannot write {codec} video to {path}")
    frames = int(seconds * FPS)
    walk = walk_positions(10, 40)
    for i in range(frames):
        writer.write(compose(walk[i % len(walk)]))
    writer.release()
    return path


def stream_spec(index: int, clip: Path, model: str = MODEL) -> PipelineSpec:
    return PipelineSpec(
        id=f"cam{index}",
        model=ModelRef(name=model),
        source=FileSourceSpec(path=clip, realtime=True, loop=True),
        sinks=[],
    )


def judge(mode: str, rows: list[tuple[float, int, int, float]], load: float) -> Trial:
    """rows: per stream (fps, dropped, played, p95 end-to-end ms)."""
    dropped = sum(r[1] for r in rows)
    worst = max(r[3] for r in rows)
    return Trial(
        mode=mode,
        streams=len(rows),
        fits=dropped == 0 and worst < P95_LIMIT_MS,
        fps=sum(r[0] for r in rows),
        dropped=dropped,
        played=sum(r[2] for r in rows),
        p95_ms=worst,
        load=load,
    )


def in_process(
    streams: int,
    clip: Path,
    pool: ModelPool,
    seconds: float,
    spread: bool = True,
    model: str = MODEL,
) -> Trial:
    group = PipelineGroup([stream_spec(i, clip, model) for i in range(streams)], pool)
    try:
        if spread:
            # Out of step, as separate cameras are: stream i's frames come due i/N of a
            # frame interval after stream 0's, instead of all on the same tick.
            for i, handle in enumerate(group.handles):
                source = handle.pipeline.source
                if isinstance(source, RealtimeFileSource):
                    source.phase = i / streams / FPS
        timer = threading.Timer(seconds, group.stop)
        timer.start()
        outcomes = group.run()
        timer.cancel()
        sources = [h.pipeline.source for h in group.handles]
    finally:
        group.close()
    rows = []
    for outcome, source in zip(outcomes, sources, strict=True):
        if outcome.error is not None:
            raise MeasureError(f"a stream failed: {outcome.error}")
        played = source.played if isinstance(source, RealtimeFileSource) else 0
        e2e = outcome.stats.stages["end_to_end"]
        rows.append((outcome.stats.fps, outcome.stats.dropped, played, e2e.p95_ms))
    return judge("one process", rows, load_1m())


def processes(streams: int, clip: Path, seconds: float, folder: Path, model: str = MODEL) -> Trial:
    """`streams` separate run-pipeline processes, started together, each stopped by SIGINT once
    it has played `seconds`."""
    procs: list[subprocess.Popen[bytes]] = []
    outputs: list[IO[str]] = []
    for i in range(streams):
        spec = folder / f"cam{i}.json"
        spec.write_text(stream_spec(i, clip, model).model_dump_json())
        out = (folder / f"cam{i}.out").open("w+")
        outputs.append(out)
        procs.append(
            subprocess.Popen(
                [str(BIN / "edge-agent"), "run-pipeline", str(spec), "--json"],
                stdout=out,
                stderr=subprocess.DEVNULL,
                env=dict(os.environ, EDGE_AGENT_STATE_DIR=str(folder / "state")),
            )
        )
    try:
        load = _play_for(procs, outputs, seconds)
        for proc in procs:
            proc.wait(timeout=30)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    rows = []
    for output in outputs:
        output.seek(0)
        text = output.read()
        output.close()
        try:
            lines = [json.loads(line) for line in text.splitlines() if '"summary"' in line]
            summary, source = lines[-1]["summary"], lines[-1]["source"]
            e2e = summary["stages"]["end_to_end"]["p95_ms"]
            rows.append((summary["fps"], summary["dropped"], source.get("played", 0), e2e))
        except (IndexError, KeyError, TypeError, ValueError):
            raise MeasureError(
                f"a run-pipeline process printed no summary: {one_line(text[-300:])}"
            ) from None
    return judge("separate processes", rows, load)


def _play_for(
    procs: list[subprocess.Popen[bytes]], outputs: list[IO[str]], seconds: float
) -> float:
    """Stop each process with SIGINT `seconds` after its first result, so that each plays as
    long as a trial in one process does (compile time, which differs, is not played); the
    load average when the last was stopped."""
    started: dict[int, float] = {}
    deadline = time.monotonic() + START_WAIT_S
    stopped: set[int] = set()
    while len(stopped) < len(procs):
        now = time.monotonic()
        for i, (proc, out) in enumerate(zip(procs, outputs, strict=True)):
            if i in stopped:
                continue
            if proc.poll() is not None:
                raise MeasureError(f"run-pipeline process {i} ended by itself ({proc.returncode})")
            if i not in started:
                if os.fstat(out.fileno()).st_size > 0:  # its first result line
                    started[i] = now
                elif now > deadline:
                    raise MeasureError(
                        f"run-pipeline process {i} gave no result in {START_WAIT_S:g} s"
                    )
            elif now >= started[i] + seconds:
                proc.send_signal(signal.SIGINT)
                stopped.add(i)
        time.sleep(0.05)
    return load_1m()


def largest_fit(
    clip: Path,
    pool: ModelPool,
    seconds: float,
    max_n: int,
    say: Any,
    start: int = 1,
    spread: bool = True,
    model: str = MODEL,
) -> tuple[int, list[Trial]]:
    """Double N from `start` until it no longer fits, then bisect; the largest N that fit
    (0 if none). A `start` that does not fit bisects down from it."""
    trials: list[Trial] = []

    def fits(n: int) -> bool:
        trial = in_process(n, clip, pool, seconds, spread, model)
        trials.append(trial)
        say(f"  {n} streams in one process: {'fits' if trial.fits else 'does not fit'}")
        return trial.fits

    good, bad = 0, max_n + 1
    n = max(1, min(start, max_n))
    while n <= max_n:
        if not fits(n):
            bad = n
            break
        good, n = n, n * 2
    if bad > max_n and good < max_n:
        bad = max_n + 1 if fits(max_n) else max_n
        good = max_n if bad > max_n else good
    while bad - good > 1:
        middle = (good + bad) // 2
        if fits(middle):
            good = middle
        else:
            bad = middle
    return good, trials


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="run time of each trial")
    parser.add_argument("--max-n", type=int, default=48, help="most streams to try")
    parser.add_argument(
        "--start-n", type=int, default=1, help="streams to try first (then doubled or bisected)"
    )
    parser.add_argument("--no-processes", action="store_true", help="skip separate processes")
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    parser.add_argument(
        "--codec",
        choices=("mjpg", "raw"),
        default="mjpg",
        help="what the cameras send: MJPG, decoded on the CPU, or raw frames (no decode)",
    )
    parser.add_argument(
        "--in-step",
        action="store_true",
        help="every stream's frame comes due on the same tick (the worst case for a burst), "
        "instead of out of step as separate cameras are",
    )
    parser.add_argument(
        "--model",
        default=MODEL,
        help="a reference model name, or a model file with its manifest beside it, such as "
        "the model.xml `edge-agent calibrate` writes: the streams and benchmark_app both run it",
    )
    args = parser.parse_args()
    out, err = consoles(120)

    def say(text: str) -> None:
        err.print(text)

    report = print_machine(out, {"opencv": cv2.__version__})
    cache = Path(os.environ.get("EDGE_AGENT_CACHE", ".cache/edge-agent"))
    pool = ModelPool(Catalog(default_models_dir(), cache))
    codec = "MJPG" if args.codec == "mjpg" else "raw"
    step = "in step" if args.in_step else "out of step"
    table = Table(
        title=f"{args.model}, 640x480 {codec} streams at {FPS:g} FPS, {step}, "
        f"{args.seconds:g} s each"
    )
    for column in ("mode", "streams", "fits", "FPS", "dropped", "worst p95 ms", "load 1m"):
        table.add_column(column, justify="left" if column == "mode" else "right")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            model = describe(args.model)  # first: a bad --model fails before any work
            clip = write_clip(folder / "stream.avi", codec=args.codec)
            say("benchmark_app -hint throughput")
            app_s = int(min(15.0, max(3.0, args.seconds)))
            frames = folder / "frames"
            frames.mkdir()
            write_frames(clip, frames)
            home = quiet_home(folder)
            limit_run = benchmark_app(model, app_s, None, home, inputs=frames)
            limit_load = load_1m()
            say("searching the largest N in one process")
            best, trials = largest_fit(
                clip,
                pool,
                args.seconds,
                args.max_n,
                say,
                start=args.start_n,
                spread=not args.in_step,
                model=args.model,
            )
            if best and not args.no_processes:
                say(f"{best} separate processes")
                trials.append(processes(best, clip, args.seconds, folder, args.model))
            # Again at the end: a shared host's speed drifts over a run of many minutes
            # (benchmark_app on one such host read 297 to 338 FPS within an hour), and a
            # limit taken only before the search would judge it against another machine.
            say("benchmark_app -hint throughput, again")
            after_run = benchmark_app(model, app_s, None, home, inputs=frames)
            after_load = load_1m()
    except MeasureError as exc:
        err.print(f"[red]error:[/] {exc}")
        return 2
    for trial in trials:
        table.add_row(*trial.row())
    app_fps = (limit_run.fps + after_run.fps) / 2
    drift = abs(after_run.fps - limit_run.fps) / app_fps
    limit = app_fps / FPS
    # A calibrated model's rung, beside the precision its other layers run at.
    calibrated = f"{model.quantization}, else " if model.quantization else ""
    table.caption = (
        f"{flags_text(cpu_flags())}\n"
        f"theoretical limit: benchmark_app {app_fps:.1f} FPS ({calibrated}{limit_run.precision}; "
        f"{limit_run.fps:.1f} before the search, load {limit_load:.2f}, {after_run.fps:.1f} "
        f"after, load {after_load:.2f}) / {FPS:g} = {limit:.1f} streams; "
        f"one process fits {best} = {best / limit:.2f}x of it"
        + (
            f"\n[yellow]the host's speed moved {drift:.0%} during the run: "
            "the ratio is approximate[/]"
            if drift > DRIFT_NOTED
            else ""
        )
    )
    out.print(table)
    report.update(
        model=args.model,
        quantization=model.quantization,
        precision=limit_run.precision,
        codec=args.codec,
        spread=not args.in_step,
        streams=best,
        theoretical_streams=limit,
        benchmark_app_fps=app_fps,
        benchmark_app_fps_before=limit_run.fps,
        benchmark_app_fps_after=after_run.fps,
        trials=[asdict(t) for t in trials],
    )
    finish(out, report, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
