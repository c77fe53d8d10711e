"""What tools/bench_pipeline.py runs: the pipeline itself, and the loops it is compared with.

Each returns a `Run` (a `PipelineRun` for the pipeline, with its stage latencies), or raises
MeasureError with one line saying why not.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import openvino as ov
from benchlib import BIN, MeasureError, ModelUnderTest, Run, one_line, run_command

# What a hand-written loop hard-codes for the TF Object Detection API graph.
SSD_BOXES = "detection_boxes:0"
SSD_SCORES = "detection_scores:0"
SSD_CLASSES = "detection_classes:0"
SSD_THRESHOLD = 0.5
# Every this many frames of the video is handed to benchmark_app as an input image.
BENCHMARK_APP_FRAME_STRIDE = 20


@dataclass(frozen=True, slots=True)
class Stage:
    """One stage of a pipeline's summary, in milliseconds."""

    count: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    mean_ms: float


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineRun(Run):
    """A run of `edge-agent run-pipeline`, with what its summary says."""

    dropped: int = 0
    stages: dict[str, Stage] = field(default_factory=dict)


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


def write_raw(video: Path, out: Path) -> int:
    """The same frames as uncompressed video: what a camera sending raw frames (a USB
    camera's YUYV mode) costs the pipeline, with a colour conversion to read each frame but
    no decode. OpenCV's FFmpeg writes fourcc 0 as 4:2:0 planes, 460 KB a 640x480 frame.
    """
    cap = cv2.VideoCapture(str(video), cv2.CAP_FFMPEG)
    fps = cap.get(cv2.CAP_PROP_FPS) or 30.0
    size = (int(cap.get(cv2.CAP_PROP_FRAME_WIDTH)), int(cap.get(cv2.CAP_PROP_FRAME_HEIGHT)))
    writer = cv2.VideoWriter(str(out), 0, fps, size)
    written = 0
    try:
        if not writer.isOpened():
            raise MeasureError(f"OpenCV cannot write raw video to {out}")
        while True:
            ok, image = cap.read()
            if not ok:
                break
            writer.write(image)
            written += 1
    finally:
        cap.release()
        writer.release()
    if written == 0:
        raise MeasureError(f"OpenCV read no frame back from {video}")
    return written


def decode_only(video: Path) -> Run:
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
    return Run(fps=frames / elapsed, p50_ms=elapsed / frames * 1e3)


def run_pipeline(
    model: str,
    video: Path,
    hint: str = "throughput",
    backend: str = "openvino",
    telemetry: bool = True,
) -> PipelineRun:
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
    return PipelineRun(
        fps=fps,
        p50_ms=e2e.p50_ms if measured and e2e else None,
        p95_ms=e2e.p95_ms if measured and e2e else None,
        dropped=dropped,
        stages=stages if measured else {},
    )


def edge_agent_compile(model: str, backend: str) -> tuple[str, int]:
    """The precision and infer requests edge-agent compiles `model` with, throughput hint."""
    argv = [str(BIN / "edge-agent"), "bench", "--model", model, "--backend", backend]
    # Only the compile report is read: a few runs are enough, a second of them was 1 s more.
    argv += ["--hint", "throughput", "--time", "0.05", "--json"]
    out = run_command(argv)
    try:
        report = json.loads(out.strip().splitlines()[-1])["compile"]
        return str(report["precision"]), int(report["requests"])
    except (json.JSONDecodeError, IndexError, KeyError, TypeError, ValueError):
        raise MeasureError(f"edge-agent bench printed no result: {one_line(out)}") from None


class NaiveLoop:
    """The loop a user writes first: default compile, resize and convert by hand, sync calls."""

    def __init__(self, model: ModelUnderTest, video: Path) -> None:
        self._video = video
        self._height, self._width = model.shape[1], model.shape[2]
        core = ov.Core()
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

    def run(self) -> Run:
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
        return Run(
            fps=len(latencies) / elapsed,
            p50_ms=float(np.percentile(latencies, 50)) * 1e3,
            p95_ms=float(np.percentile(latencies, 95)) * 1e3,
            precision=self.precision,
            requests=1,
        )
