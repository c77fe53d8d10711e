"""How fast `edge-agent run-pipeline` runs person-ssdlite on a video file, against its references.

In one run, on the CPU, over one 640x480 30 fps MJPG video built from scikit-image photos (the
astronaut walking across the coffee scene of tests/integration/video.py, `--frames` long):

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
6. ONNX Runtime where the model allows: person-ssdlite is a TF frozen graph ONNX Runtime cannot
   read, so it is skipped with the reason, and the ONNX model text-orientation runs through the
   pipeline on each backend over the same video instead, once each.

It prints every figure beside the precision it ran at, and the ratios the pipeline is held to:
pipeline / benchmark_app throughput >= 0.85, pipeline / naive loop >= 1.7 and telemetry cost
(FPS with telemetry off minus on, over off) < 2%; the p95 end-to-end latency under the latency
hint is reported without a target. A ratio whose rounds disagree by more than 15% is flagged
noisy; the load average is printed before and after. The default run takes about 3 minutes.

Run it from the checkout, with the models already fetched:

    EDGE_AGENT_CACHE=/tmp/eacache python tools/bench_pipeline.py
    python tools/bench_pipeline.py --frames 900 --time 15 --rounds 3 --json out.json

Exit status: 0 when every figure was measured and every target met, 1 when a target was
missed, 2 when a measurement failed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import numpy.typing as npt
import openvino as ov
from rich.console import Console
from rich.table import Table

# The test video's scene comes from the checkout's tests; bench_runtime sits beside this file.
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench_runtime import (  # noqa: E402
    NOISY_SPREAD,
    MeasureError,
    ModelUnderTest,
    cpu_name,
    describe,
    grab,
    load_average,
    one_line,
    run_command,
)

from tests.integration.video import FPS, HEIGHT, WIDTH, compose, walk_positions  # noqa: E402

BIN = Path(sys.executable).parent
MODEL = "person-ssdlite"
ORT_MODEL = "text-orientation"
TARGET_VS_BENCHMARK_APP = 0.85
TARGET_VS_NAIVE = 1.7
TARGET_TELEMETRY_COST_PCT = 2.0
# What a hand-written loop hard-codes for the TF Object Detection API graph.
SSD_BOXES, SSD_SCORES, SSD_CLASSES = (
    "detection_boxes:0",
    "detection_scores:0",
    "detection_classes:0",
)
SSD_THRESHOLD = 0.5
# Every this many frames of the video is handed to benchmark_app as an input image.
BENCHMARK_APP_FRAME_STRIDE = 20
_OV_PRECISION = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}

DECODE = "decode only (cv2)"
PIPE_ON = "pipeline OV throughput"
PIPE_OFF = "pipeline OV throughput --no-telemetry"
PIPE_LAT = "pipeline OV latency"
BAPP = "benchmark_app throughput"
BAPP_LAT = "benchmark_app latency"
NAIVE = "naive loop"
PIPE_ORT = "pipeline ORT"
TEXT_OV = f"{ORT_MODEL} pipeline OV"
TEXT_ORT = f"{ORT_MODEL} pipeline ORT"
ROUND_KINDS = (PIPE_ON, PIPE_OFF, BAPP, NAIVE)


@dataclass(frozen=True, slots=True)
class Stage:
    """One stage of a pipeline's summary, in milliseconds."""

    count: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    mean_ms: float


@dataclass(frozen=True, slots=True)
class Sample:
    """One timed run of one measurement."""

    fps: float
    p50_ms: float | None = None
    p95_ms: float | None = None
    requests: int | None = None
    dropped: int | None = None
    stages: dict[str, Stage] | None = None


@dataclass(slots=True)
class Figure:
    """All runs of one measurement."""

    name: str
    precision: str | None = None
    requests: int | None = None
    """Infer requests when the runs do not report their own."""
    precision_error: str | None = None
    samples: list[Sample] = field(default_factory=list)
    error: str | None = None
    skipped: str | None = None

    @property
    def ok(self) -> bool:
        return bool(self.samples) and self.error is None

    @property
    def fps(self) -> float | None:
        return statistics.median(s.fps for s in self.samples) if self.ok else None

    def median_of(self, pick: Callable[[Sample], float | None]) -> float | None:
        values = [v for s in self.samples if (v := pick(s)) is not None] if self.ok else []
        return statistics.median(values) if values else None

    @property
    def spread(self) -> float:
        """Fastest round over slowest: how much the machine moved under this measurement."""
        rates = [s.fps for s in self.samples]
        return max(rates) / min(rates) if rates and min(rates) > 0 else 1.0

    @property
    def median_sample(self) -> Sample | None:
        """The round whose FPS is the median (the lower middle one of an even count)."""
        if not self.ok:
            return None
        ranked = sorted(self.samples, key=lambda s: s.fps)
        return ranked[(len(ranked) - 1) // 2]


@dataclass(frozen=True, slots=True)
class Ratio:
    """A derived figure, with its target if it has one."""

    name: str
    value: float | None
    unit: str
    target: float | None = None
    at_least: bool = True
    noisy: bool = False

    @property
    def passed(self) -> bool | None:
        if self.value is None or self.target is None:
            return None
        return self.value >= self.target if self.at_least else self.value < self.target

    def text(self, value: float | None) -> str:
        if value is None:
            return "—"
        return f"{value:.2f}x" if self.unit == "x" else f"{value:.1f} {self.unit}"


def write_video(path: Path, frames: int) -> None:
    """The astronaut crossing the coffee scene, again and again, `frames` long, MJPG."""
    positions = walk_positions(45, 40)
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"MJPG"), FPS, (WIDTH, HEIGHT))
    if not writer.isOpened():
        raise MeasureError("OpenCV cannot write MJPG video here")
    scenes: dict[int, npt.NDArray[np.uint8]] = {}
    try:
        for index in range(frames):
            x = positions[index % len(positions)]
            if x not in scenes:
                scenes[x] = compose(x)
            writer.write(scenes[x])
    finally:
        writer.release()


def write_frames(video: Path, folder: Path) -> int:
    """Every BENCHMARK_APP_FRAME_STRIDE-th frame as a PNG, for benchmark_app's -i."""
    cap = cv2.VideoCapture(str(video), cv2.CAP_FFMPEG)
    index = written = 0
    try:
        while True:
            ok, image = cap.read()
            if not ok:
                break
            if index % BENCHMARK_APP_FRAME_STRIDE == 0:
                cv2.imwrite(str(folder / f"frame{index:05d}.png"), image)
                written += 1
            index += 1
    finally:
        cap.release()
    if written == 0:
        raise MeasureError(f"OpenCV read no frame back from {video}")
    return written


def decode_only(video: Path) -> Sample:
    """How fast OpenCV alone reads the file: the ceiling any pipeline over it has."""
    cap = cv2.VideoCapture(str(video), cv2.CAP_FFMPEG)
    frames = 0
    begin = time.perf_counter()
    try:
        while cap.read()[0]:
            frames += 1
    finally:
        cap.release()
    elapsed = time.perf_counter() - begin
    if frames == 0:
        raise MeasureError(f"OpenCV decoded no frame of {video}")
    return Sample(fps=frames / elapsed, p50_ms=elapsed / frames * 1e3)


def run_pipeline(
    model: str,
    video: Path,
    hint: str = "throughput",
    backend: str = "openvino",
    telemetry: bool = True,
) -> Sample:
    """`edge-agent run-pipeline --json` in its own process; the figures of its summary line."""
    argv = [str(BIN / "edge-agent"), "run-pipeline", "--model", model, "--source", str(video)]
    argv += ["--backend", backend, "--hint", hint, "--json"]
    if not telemetry:
        argv.append("--no-telemetry")
    out = run_command(argv)
    lines = out.strip().splitlines()
    try:
        summary: dict[str, Any] = json.loads(lines[-1])["summary"]
        stages = {
            name: Stage(
                count=int(s["count"]),
                p50_ms=float(s["p50_ms"]),
                p95_ms=float(s["p95_ms"]),
                p99_ms=float(s["p99_ms"]),
                mean_ms=float(s["mean_ms"]),
            )
            for name, s in summary["stages"].items()
        }
        fps = float(summary["fps"])
        dropped = int(summary["dropped"])
    except (json.JSONDecodeError, IndexError, KeyError, TypeError, ValueError):
        raise MeasureError(f"run-pipeline printed no summary: {one_line(out)}") from None
    if int(summary.get("frames", 0)) != len(lines) - 1:
        raise MeasureError(
            f"run-pipeline summed {summary.get('frames')} of {len(lines) - 1} frames"
        )
    e2e = stages.get("end_to_end")
    measured = e2e is not None and e2e.count > 0
    return Sample(
        fps=fps,
        p50_ms=e2e.p50_ms if measured and e2e else None,
        p95_ms=e2e.p95_ms if measured and e2e else None,
        dropped=dropped,
        stages=stages if measured else None,
    )


def edge_agent_compile(model: str, backend: str) -> tuple[str, int]:
    """The precision and infer requests edge-agent compiles `model` with, throughput hint."""
    argv = [str(BIN / "edge-agent"), "bench", "--model", model, "--backend", backend]
    argv += ["--hint", "throughput", "--time", "1", "--json"]
    out = run_command(argv)
    try:
        report = json.loads(out.strip().splitlines()[-1])["compile"]
        return str(report["precision"]), int(report["requests"])
    except (json.JSONDecodeError, IndexError, KeyError, TypeError, ValueError):
        raise MeasureError(f"edge-agent bench printed no result: {one_line(out)}") from None


def _quiet_home(root: Path) -> str:
    """A HOME whose OpenVINO telemetry consent file says no, for benchmark_app."""
    home = root / "home"
    (home / "intel").mkdir(parents=True)
    (home / "intel" / "openvino_telemetry").write_text("0\n")
    return str(home)


@dataclass(frozen=True, slots=True)
class BenchmarkApp:
    """benchmark_app on the model file, at its shape, over frames of the video."""

    model: ModelUnderTest
    frames: Path
    home: str

    def run(self, hint: str, seconds: int) -> tuple[Sample, str]:
        """One run; the sample and the precision it ran at."""
        shape = f"{self.model.input_name}[{','.join(str(d) for d in self.model.shape)}]"
        argv = [str(BIN / "benchmark_app"), "-m", str(self.model.path), "-d", "CPU"]
        argv += ["-hint", hint, "-t", str(seconds), "-shape", shape, "-i", str(self.frames)]
        if hint == "latency":
            argv += ["-latency_percentile", "95"]
        out = run_command(argv, env={**os.environ, "HOME": self.home})
        ov_type = grab(r"INFERENCE_PRECISION_HINT: <Type: '(\w+)'>", out)
        iterations = int(grab(r"Count:\s+(\d+) iterations", out))
        duration_s = float(grab(r"Duration:\s+([\d.]+) ms", out)) / 1e3
        found = re.search(r"asynchronously, (\d+) inference requests", out)
        requests = int(found.group(1)) if found else 1
        if hint == "latency":
            p50, p95 = None, float(grab(r"95 percentile:\s+([\d.]+) ms", out))
        else:
            p50, p95 = float(grab(r"Median:\s+([\d.]+) ms", out)), None
        sample = Sample(fps=iterations / duration_s, p50_ms=p50, p95_ms=p95, requests=requests)
        return sample, _OV_PRECISION.get(ov_type, ov_type)


class NaiveLoop:
    """The loop a user writes first: default compile, resize and convert by hand, sync calls."""

    def __init__(self, core: ov.Core, model: ModelUnderTest, video: Path) -> None:
        self._video = video
        self._height, self._width = model.shape[1], model.shape[2]
        try:
            graph = core.read_model(str(model.path))
            graph.reshape({model.input_name: ov.PartialShape(list(model.shape))})
            self._compiled: Any = core.compile_model(graph, "CPU")
        except RuntimeError as exc:
            raise MeasureError(
                f"OpenVINO cannot compile {model.name}: {one_line(str(exc))}"
            ) from None
        self.detections: list[tuple[int, float, tuple[float, ...]]] = []
        self._outputs = [self._compiled.output(n) for n in (SSD_BOXES, SSD_SCORES, SSD_CLASSES)]
        self.precision = str(
            self._compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()
        )
        # The first call allocates; keep it out of the timing.
        self._compiled(np.zeros(model.shape, dtype=np.uint8))

    def run(self) -> Sample:
        cap = cv2.VideoCapture(str(self._video), cv2.CAP_FFMPEG)
        latencies: list[float] = []
        begin = time.perf_counter()
        try:
            while True:
                started = time.perf_counter()
                ok, frame = cap.read()
                if not ok:
                    break
                height, width = frame.shape[:2]
                small = cv2.resize(frame, (self._width, self._height))
                x = cv2.cvtColor(small, cv2.COLOR_BGR2RGB)
                result = self._compiled(x[None])
                boxes, scores, classes = (result[o][0] for o in self._outputs)
                keep = scores >= SSD_THRESHOLD
                # TF boxes are (ymin, xmin, ymax, xmax), normalised: to pixels, (x0, y0, x1, y1).
                pixels = boxes[keep][:, [1, 0, 3, 2]] * np.array([width, height, width, height])
                self.detections = [
                    (int(c), float(s), tuple(b.tolist()))
                    for c, s, b in zip(classes[keep], scores[keep], pixels, strict=True)
                ]
                latencies.append(time.perf_counter() - started)
        finally:
            cap.release()
        elapsed = time.perf_counter() - begin
        if not latencies:
            raise MeasureError(f"the naive loop read no frame of {self._video}")
        return Sample(
            fps=len(latencies) / elapsed,
            p50_ms=float(np.percentile(latencies, 50)) * 1e3,
            p95_ms=float(np.percentile(latencies, 95)) * 1e3,
            requests=1,
        )


def _attempt(figure: Figure, say: Callable[[str], None], step: Callable[[], Sample]) -> None:
    if figure.error is not None or figure.skipped is not None:
        return
    try:
        figure.samples.append(step())
    except MeasureError as exc:
        figure.error = str(exc)
        say(f"[red]error:[/] {figure.name}: {exc}")


def measure(
    model: ModelUnderTest,
    video: Path,
    bapp: BenchmarkApp,
    seconds: int,
    rounds: int,
    say: Callable[[str], None],
) -> dict[str, Figure]:
    """Every measurement: the compared ones in rounds of alternating order, the rest once."""
    figures = {
        name: Figure(name)
        for name in (DECODE, PIPE_ON, PIPE_OFF, PIPE_LAT, BAPP, BAPP_LAT, NAIVE, PIPE_ORT)
    }
    figures.update({TEXT_OV: Figure(TEXT_OV), TEXT_ORT: Figure(TEXT_ORT)})
    if model.format != "onnx":
        figures[PIPE_ORT].skipped = (
            f"{model.name} is a {model.format} model, which ONNX Runtime cannot read; "
            f"{ORT_MODEL} (ONNX) compares the backends instead"
        )

    say("  decode only")
    _attempt(figures[DECODE], say, lambda: decode_only(video))
    say("  precisions (edge-agent bench --time 1)")
    for name, target, backend in (
        (PIPE_ON, MODEL, "openvino"),
        (TEXT_OV, ORT_MODEL, "openvino"),
        (TEXT_ORT, ORT_MODEL, "onnxruntime"),
    ):
        try:
            figures[name].precision, figures[name].requests = edge_agent_compile(target, backend)
        except MeasureError as exc:
            # The FPS is still worth measuring; the missing precision still fails the run.
            figures[name].precision_error = f"precision unknown: {exc}"
            say(f"[red]error:[/] {name}: {exc}")
    # run-pipeline --hint latency compiles at the device's default precision too.
    figures[PIPE_OFF].precision = figures[PIPE_LAT].precision = figures[PIPE_ON].precision
    figures[PIPE_OFF].requests = figures[PIPE_ON].requests

    naive: NaiveLoop | None = None

    def naive_run() -> Sample:
        nonlocal naive
        if naive is None:
            naive = NaiveLoop(ov.Core(), model, video)
            figures[NAIVE].precision = naive.precision
        return naive.run()

    def bapp_run(hint: str, figure: Figure) -> Sample:
        sample, figure.precision = bapp.run(hint, seconds)
        return sample

    steps: dict[str, Callable[[], Sample]] = {
        PIPE_ON: lambda: run_pipeline(MODEL, video),
        PIPE_OFF: lambda: run_pipeline(MODEL, video, telemetry=False),
        BAPP: lambda: bapp_run("throughput", figures[BAPP]),
        NAIVE: naive_run,
    }
    for index in range(rounds):
        order = ROUND_KINDS if index % 2 == 0 else tuple(reversed(ROUND_KINDS))
        for kind in order:
            say(f"  round {index + 1}/{rounds}: {kind}")
            _attempt(figures[kind], say, steps[kind])

    once: dict[str, Callable[[], Sample]] = {
        PIPE_LAT: lambda: run_pipeline(MODEL, video, hint="latency"),
        BAPP_LAT: lambda: bapp_run("latency", figures[BAPP_LAT]),
        TEXT_OV: lambda: run_pipeline(ORT_MODEL, video),
        TEXT_ORT: lambda: run_pipeline(ORT_MODEL, video, backend="onnxruntime"),
    }
    for kind, step in once.items():
        say(f"  once: {kind}")
        _attempt(figures[kind], say, step)
    return figures


def _noisy(*figures: Figure) -> bool:
    return any(f.spread > NOISY_SPREAD for f in figures)


def ratios(figures: dict[str, Figure]) -> list[Ratio]:
    """The targets, then the figures that explain them."""
    on, off, lat = figures[PIPE_ON], figures[PIPE_OFF], figures[PIPE_LAT]

    def over(a: Figure, b: Figure) -> float | None:
        return None if a.fps is None or not b.fps else a.fps / b.fps

    bapp, naive = figures[BAPP], figures[NAIVE]
    cost = None if on.fps is None or not off.fps else (off.fps - on.fps) / off.fps * 100
    found = [
        Ratio(
            f"{PIPE_ON} / {BAPP}",
            over(on, bapp),
            "x",
            TARGET_VS_BENCHMARK_APP,
            noisy=_noisy(on, bapp),
        ),
        Ratio(
            f"{PIPE_ON} / {NAIVE}", over(on, naive), "x", TARGET_VS_NAIVE, noisy=_noisy(on, naive)
        ),
        Ratio(
            "telemetry cost (FPS off - on) / off",
            cost,
            "%",
            TARGET_TELEMETRY_COST_PCT,
            at_least=False,
            noisy=_noisy(on, off),
        ),
        Ratio("p95 end-to-end latency, latency hint", lat.median_of(lambda s: s.p95_ms), "ms"),
        Ratio(f"{DECODE} / {PIPE_ON}", over(figures[DECODE], on), "x"),
    ]
    busy = on.median_sample
    if busy is not None and busy.stages is not None and {"read", "infer"} <= busy.stages.keys():
        # The caller's thread reads and submits: its own work per frame, times frames per second.
        prepare = busy.stages.get("preprocess")
        reader = busy.stages["read"].mean_ms + (prepare.mean_ms if prepare else 0.0)
        found.append(
            Ratio("reader thread busy: (read + preprocess) x FPS", reader * busy.fps / 10, "%")
        )
        if on.requests:
            engine = busy.stages["infer"].mean_ms * busy.fps / on.requests / 10
            found.append(Ratio(f"infer requests busy: infer x FPS / {on.requests}", engine, "%"))
    found.append(Ratio(f"{TEXT_OV} / {TEXT_ORT}", over(figures[TEXT_OV], figures[TEXT_ORT]), "x"))
    return found


def render(
    figures: dict[str, Figure], found: list[Ratio], frames: int, seconds: int, rounds: int
) -> list[Table]:
    """The figures, the pipeline's stages, and the ratios."""
    notes = [
        f"{f.name}: {problem}"
        for f in figures.values()
        for problem in (f.skipped, f.error, f.precision_error)
        if problem is not None
    ]
    notes.append(
        "p50/p95: pipelines, end_to_end stage (read to sink); benchmark_app, one inference; "
        "naive loop, one whole iteration; decode only, mean per frame"
    )
    notes.append(
        f"FPS is the median of the rounds; pipelines and the naive loop run the {frames}-frame "
        f"video, benchmark_app {seconds} s per run"
    )
    table = Table(
        title=f"{MODEL} (tf, 1x300x300x3) on CPU, 640x480 MJPG video",
        caption="\n".join(notes),
        caption_justify="left",
    )
    columns = ("measurement", "FPS", "p50 ms", "p95 ms", "precision", "nireq", "FPS per round")
    for column in columns:
        table.add_column(column, justify="left" if column == "measurement" else "right")

    def ms(value: float | None) -> str:
        return "—" if value is None else f"{value:.2f}"

    for f in figures.values():
        if f.fps is None:
            state = "[dim]skipped[/]" if f.skipped is not None else "[red]failed[/]"
            table.add_row(f.name, "—", "—", "—", "—", "—", state)
            continue
        requests = sorted({s.requests for s in f.samples if s.requests is not None})
        if not requests and f.requests is not None:
            requests = [f.requests]
        table.add_row(
            f.name,
            f"{f.fps:.1f}",
            ms(f.median_of(lambda s: s.p50_ms)),
            ms(f.median_of(lambda s: s.p95_ms)),
            f.precision or "—",
            "/".join(str(r) for r in requests) or "—",
            " / ".join(f"{s.fps:.1f}" for s in f.samples),
        )

    stages = Table(
        title=f"{MODEL} pipeline stages, ms (the median round of each)",
        caption="thr: --hint throughput, lat: --hint latency; queue: waiting for a free infer "
        "request, plus the resize to the model's input (both in the reader's thread)",
        caption_justify="left",
    )
    stages.add_column("stage")
    picked = [(name, figures[name].median_sample) for name in (PIPE_ON, PIPE_LAT)]
    for name, _ in picked:
        hint = name.rsplit(" ", 1)[-1][:3]
        for stat in ("p50", "p95", "p99", "mean"):
            stages.add_column(f"{hint} {stat}", justify="right")
    names: list[str] = []
    for _, sample in picked:
        for stage in (sample.stages or {}) if sample else {}:
            if stage not in names:
                names.append(stage)
    for stage in names:
        cells = [stage]
        for _, sample in picked:
            s = (sample.stages or {}).get(stage) if sample else None
            values = (s.p50_ms, s.p95_ms, s.p99_ms, s.mean_ms) if s else (None,) * 4
            cells += [ms(v) for v in values]
        stages.add_row(*cells)

    verdicts = Table(title=f"{MODEL}: pipeline against its references ({rounds} round(s))")
    for column in ("ratio", "value", "target", "result"):
        verdicts.add_column(column, justify="left" if column == "ratio" else "right")
    for r in found:
        target = "—" if r.target is None else (">= " if r.at_least else "< ") + r.text(r.target)
        verdict = {True: "[green]pass[/]", False: "[red]FAIL[/]", None: "[dim]info[/]"}[r.passed]
        if r.noisy:
            verdict += " [yellow](noisy)[/]"
        verdicts.add_row(r.name, r.text(r.value), target, verdict)
    if any(r.noisy for r in found):
        verdicts.caption = (
            f"noisy: rounds of a measurement differ by more than {NOISY_SPREAD - 1:.0%}; "
            "rerun on an idle machine"
        )
        verdicts.caption_justify = "left"
    return [table, stages, verdicts]


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

    # Piped output (a log, CI) gets room for the tables instead of rich's 80 columns.
    console = Console(width=None if sys.stdout.isatty() else 110)
    status = Console(stderr=True, soft_wrap=True)
    import onnxruntime  # Only for its version: the measurement itself runs in edge-agent.

    load_before = load_average()
    console.print(f"CPU: {cpu_name()} ({os.cpu_count()} logical)")
    console.print(f"OpenVINO {ov.get_version()}, ONNX Runtime {onnxruntime.__version__}")
    console.print(f"load average before: {load_before}")
    console.print(
        f"{args.frames}-frame video; {rounds} round(s); benchmark_app {seconds} s per run"
    )
    report: dict[str, Any] = {
        "cpu": cpu_name(),
        "logical_cpus": os.cpu_count(),
        "openvino": ov.get_version(),
        "onnxruntime": onnxruntime.__version__,
        "frames": args.frames,
        "rounds": rounds,
        "benchmark_app_seconds": seconds,
    }
    with tempfile.TemporaryDirectory(prefix="bench-pipeline-") as tmp:
        root = Path(tmp)
        video = root / "walk.avi"
        frames = root / "frames"
        frames.mkdir()
        try:
            status.print(f"[bold]{MODEL}[/]")
            model = describe(MODEL, None)
            status.print(f"  writing {video.name}, {args.frames} frames")
            write_video(video, args.frames)
            write_frames(video, frames)
        except MeasureError as exc:
            status.print(f"[red]error:[/] {exc}")
            return 2
        bapp = BenchmarkApp(model, frames, _quiet_home(root))
        figures = measure(model, video, bapp, seconds, rounds, status.print)
    found = ratios(figures)
    for table in render(figures, found, args.frames, seconds, rounds):
        console.print(table)
    load_after = load_average()
    console.print(f"load average after: {load_after}")
    report["load_average"] = {"before": load_before, "after": load_after}
    report["figures"] = {
        f.name: {
            "fps": f.fps,
            "precision": f.precision,
            "spread": f.spread,
            "runs": [asdict(s) for s in f.samples],
            "error": f.error or f.precision_error,
            "skipped": f.skipped,
        }
        for f in figures.values()
    }
    report["ratios"] = [{**asdict(r), "passed": r.passed} for r in found]
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        console.print(f"wrote {args.json}")
    if any(f.error is not None or f.precision_error is not None for f in figures.values()):
        return 2
    return 1 if any(r.passed is False for r in found) else 0


if __name__ == "__main__":
    sys.exit(main())
