"""Throughput and latency of a compiled model, measured the way benchmark_app does.

Inputs are built once (for image models frames at the model's input size, which is
what the pipelines and `edge-agent infer` hand the engine after fitting a whole frame
on the host, so the folded-in preprocessing runs and the host only copies; noise with
the right shape otherwise) and every request stays busy until the time is up. Latency
is the engine's time per request, without time spent queued for a free one. What the
host's fit (crop, resize) costs is a pipeline's "preprocess" stage, measured there.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from edge_agent.catalog.manifest import ImageInput, Manifest
from edge_agent.errors import EdgeAgentError
from edge_agent.runtime.base import CompiledModel, CompileReport, Tensor, Tensors

Progress = Callable[[float], None]
"""Called now and then with the fraction of the time elapsed."""


class BenchResult(BaseModel):
    """What `edge-agent bench` prints."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(description="Model name.")
    compile: CompileReport = Field(description="How and where the model was compiled.")
    first_inference_ms: float = Field(description="First run after compile, in ms.")
    iterations: int = Field(description="Requests completed in the timed part.")
    batch: int = Field(default=1, description="Frames (or inputs) per request.")
    seconds: float = Field(description="Duration of the timed part.")
    throughput_fps: float = Field(
        description="Frames per second: completed requests times the batch, over the time."
    )
    latency_ms: dict[str, float] = Field(description="p50, p95, p99, min, max, in ms.")


def bench_inputs(manifest: Manifest, report: CompileReport) -> dict[str, Tensor]:
    """Inputs for a benchmark: deterministic noise, so no branch in the model is special."""
    rng = np.random.default_rng(0)
    spec = manifest.input
    feeds: dict[str, Tensor] = {}
    for name, shape in report.inputs.items():
        if isinstance(spec, ImageInput) and name == spec.name:
            model_spec = spec.with_shape(report.model_shape)
            # N frames for a model compiled with batch N (bench --shape 2,3,224,224), at
            # the model's size: already fitted, as a pipeline's are, so a centre-cropped
            # model is not cropped and resized back on every request.
            size = (model_spec.shape[0], model_spec.height, model_spec.width, 3)
            feeds[name] = rng.integers(0, 256, size, dtype=np.uint8)
        else:
            feeds[name] = rng.standard_normal([max(d, 1) for d in shape]).astype(np.float32)
    return feeds


def run_bench(
    model: CompiledModel,
    manifest: Manifest,
    seconds: float,
    progress: Progress | None = None,
) -> BenchResult:
    """Keep every infer request busy for `seconds` and measure.

    `model` must be the bench's alone (compiled for it, not taken from a pool that
    pipelines share): each run submits the next from its `done`, on the model's worker,
    and a worker waiting there behind other callers' runs could leave none to run them.
    A model with one infer request (the latency hint) is run on this thread instead.

    Raises:
        EdgeAgentError: `seconds` is not positive (input.invalid), or the model fails.
    """
    if not seconds > 0:  # also refuses NaN
        raise EdgeAgentError(
            f"benchmark time must be positive, not {seconds}",
            "pass --time in seconds, e.g. --time 10",
            code="input.invalid",
        )
    feeds = bench_inputs(manifest, model.report)
    batch = _batch(manifest, model.report)
    started = time.perf_counter()
    model.infer(feeds)
    first_ms = (time.perf_counter() - started) * 1e3

    if model.report.requests == 1:
        elapsed, serial = _serial(model, feeds, seconds, progress)
        return _result(model, manifest, first_ms, batch, elapsed, serial)
    latencies: list[float] = []
    lock = threading.Lock()
    chains = [_in_flight(model.report)]  # runs whose `done` has not stopped its chain
    ended = threading.Event()

    def done(outputs: Tensors, userdata: object, latency: float) -> None:
        with lock:
            latencies.append(latency)
        if time.perf_counter() < deadline:
            # The next run, submitted from here as benchmark_app restarts a request from
            # its callback: a caller's thread woken to submit takes a core from the engine
            # in the middle of other runs (text-orientation on ONNX Runtime, 2 cores: 0.93x
            # of two threads calling `run` themselves, against 0.96x like this).
            model.submit(feeds, done, None)
            return
        with lock:
            chains[0] -= 1
            if chains[0] == 0:
                ended.set()

    begin = time.perf_counter()
    deadline = begin + seconds
    for _ in range(chains[0]):
        model.submit(feeds, done, None)
    # A failed run ends its chain without a word; `wait` below raises its error.
    while not ended.wait(min(0.25, max(0.0, deadline - time.perf_counter()))):
        now = time.perf_counter()
        if now >= deadline:
            break
        if progress is not None:
            progress((now - begin) / seconds)
    model.wait()
    elapsed = time.perf_counter() - begin
    if progress is not None:
        progress(1.0)
    if not latencies:  # a time shorter than one submit: measure at least one run
        model.submit(feeds, done, None)
        model.wait()
        elapsed = time.perf_counter() - begin
    return _result(model, manifest, first_ms, batch, elapsed, latencies)


_PROGRESS_S = 0.25


def _serial(
    model: CompiledModel, feeds: dict[str, Tensor], seconds: float, progress: Progress | None
) -> tuple[float, list[float]]:
    """Run after run on this thread until `seconds` are up (at least one run): the time
    taken, and each run's seconds.

    With one infer request (the latency hint) there is no second run to overlap, and
    `infer` on the caller's thread is how the audio pipeline and `edge-agent infer` run
    such a model. A chain of submits pays a hand-off to the model's worker on every run
    instead: 2-3% of a tiny model's run (face-blazeface 1,294 against 1,260 FPS, vad-silero
    10,489 against 10,291; 2 cores, alternating 2 s rounds).
    """
    latencies: list[float] = []
    begin = time.perf_counter()
    deadline = begin + seconds
    report_at = begin + _PROGRESS_S
    now = begin
    while now < deadline or not latencies:
        model.infer(feeds)
        done = time.perf_counter()
        latencies.append(done - now)  # `now` is this run's start: nothing runs in between
        now = done
        if progress is not None and now >= report_at:
            progress(min(1.0, (now - begin) / seconds))
            report_at = now + _PROGRESS_S
            now = time.perf_counter()  # the next run starts after the progress call
    if progress is not None:
        progress(1.0)
    return now - begin, latencies


def _result(
    model: CompiledModel,
    manifest: Manifest,
    first_ms: float,
    batch: int,
    elapsed: float,
    latencies: list[float],
) -> BenchResult:
    ms = np.asarray(latencies, dtype=np.float64) * 1e3
    return BenchResult(
        model=manifest.name,
        compile=model.report,
        first_inference_ms=first_ms,
        iterations=len(latencies),
        batch=batch,
        seconds=elapsed,
        throughput_fps=len(latencies) * batch / elapsed,
        latency_ms={
            "p50": float(np.percentile(ms, 50)),
            "p95": float(np.percentile(ms, 95)),
            "p99": float(np.percentile(ms, 99)),
            "min": float(ms.min()),
            "max": float(ms.max()),
        },
    )


def _in_flight(report: CompileReport) -> int:
    """Runs kept in flight: one per request, and one more queued to start as soon as a
    request frees. A model's queue takes at least that many (runtime.runs.ThreadedModel
    queues two per request, and at least four), so a `done` that submits the next run
    never waits on its own queue."""
    return report.requests + 1


def _batch(manifest: Manifest, report: CompileReport) -> int:
    spec = manifest.input
    if isinstance(spec, ImageInput):
        return spec.with_shape(report.model_shape).shape[0]
    first = report.inputs.get(spec.name, (1,))
    return max(1, first[0]) if first else 1
