"""How fast edge-agent runs a model, against the reference points a user would compare it with.

For each model, in one run, on the CPU:

1. `edge-agent bench --backend openvino --hint throughput` (the agent's own path, with the
   frame preprocessing folded into the graph; `--hint latency` runs it and every step below
   that has a hint under the latency hint instead);
2. OpenVINO's `benchmark_app -hint throughput` on the same model file and input shape;
2b. `benchmark_app` on edge-agent's own graph of the model (the frame preprocessing folded
   in, fed uint8 frames), saved as an IR: against 2 it is what the folding costs, against 1
   what edge-agent's Python around the engine costs, each reported on its own;
3. `edge-agent bench --backend onnxruntime --hint throughput`, for ONNX models (skipped, with
   the reason, for TF and TFLite);
4. the best ONNX Runtime `InferenceSession` this script can find for ONNX models: a small grid
   of streams, intra-op threads, execution mode and graph optimisation level is probed
   briefly (tools/ort_session.py), and the fastest one is measured, fed the model's input
   tensor ready-made, in a process of its own like `edge-agent bench`;
5. the naive loop a user would write: `core.compile_model(model, "CPU")` with no hints, then
   `compiled(x)` synchronously on one random input until the time is up;
6. under the latency hint, benchmark_app's own loop written in Python on edge-agent's graph
   (one infer request, `request.infer()` until the time is up), twice: with the input written
   once, as benchmark_app's is, and with the same input written into the request again before
   every run, as every real caller must write its next frame. Between 2b and 1 they split
   what edge-agent costs beyond the engine into the Python call (6 against 2b), the fresh
   input (6 fresh against 6 ready: written by this thread, read by the engine's threads on
   the other cores, its cache lines cross between cores on every run) and edge-agent's own
   bookkeeping (1 against 6 fresh).

It prints throughput (FPS) and median latency of each, beside the precision each ran at and
the load average, and the ratios the runtime is held to: edge-agent OpenVINO / benchmark_app
>= 0.97; edge-agent ONNX Runtime / the tuned session >= 0.95; on text-det-ppocr, edge-agent
OpenVINO / edge-agent ONNX Runtime >= 2.5. Each measurement runs `--rounds` times for
`--time / --rounds` seconds, in the opposite order every other round; a figure is the median
of its rounds and a ratio the median of the round-by-round ratios. A ratio whose rounds
disagree by more than 15% is flagged noisy.

Run it from the checkout, with the models already fetched:

    EDGE_AGENT_CACHE=/tmp/eacache python tools/bench_runtime.py
    python tools/bench_runtime.py --models text-orientation --compare onnxruntime --time 30
    python tools/bench_runtime.py --models text-det-ppocr --precision f32 --json out.json
    python tools/bench_runtime.py --hint latency --compare openvino
    python tools/bench_runtime.py --models /path/to/calibrated/model.xml  # calibrate's --out

`--precision` forces the precision everywhere (`--precision`, `-infer_precision` and
INFERENCE_PRECISION_HINT); without it each one runs at the device default. ONNX Runtime runs
f32 whatever it says.

Exit status: 0 when every figure was measured and every target met, 1 when a target was
missed, 2 when a measurement failed.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
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
    edge_agent_bench,
    figure_table,
    finish,
    in_rounds,
    noisy,
    one_line,
    print_machine,
    quiet_home,
    ratio_of,
    ratio_table,
)
from ort_session import OrtConfig, run_apart, tune_apart

if TYPE_CHECKING:
    from edge_agent.catalog.manifest import Manifest

DEFAULT_MODELS = ("text-det-ppocr", "person-ssdlite", "text-orientation")
# Targets; models missing from a target's table are reported without a verdict.
TARGET_VS_BENCHMARK_APP = 0.97
TARGET_ORT_VS_TUNED = 0.95
# OpenVINO's edge over ONNX Runtime comes from the device's default precision (bf16 here);
# at --precision f32 it is reported without a verdict.
TARGET_OV_VS_ORT = {"text-det-ppocr": 2.5}

EDGE_OV = "edge-agent OV"
BENCHMARK_APP = "benchmark_app"
FOLDED_APP = "benchmark_app, folded"
EDGE_ORT = "edge-agent ORT"
TUNED_ORT = "tuned ORT session"
NAIVE = "naive loop"
READY_LOOP = "engine loop, ready input"
FRESH_LOOP = "engine loop, fresh input"
COMPARE = {
    "all": (EDGE_OV, BENCHMARK_APP, FOLDED_APP, READY_LOOP, FRESH_LOOP, EDGE_ORT, TUNED_ORT, NAIVE),
    "openvino": (EDGE_OV, BENCHMARK_APP, FOLDED_APP, READY_LOOP, FRESH_LOOP, EDGE_ORT, NAIVE),
    "onnxruntime": (EDGE_ORT, TUNED_ORT),
}


def _noise(rng: np.random.Generator, shape: Sequence[int], dtype: Any) -> Any:
    """Deterministic input of `dtype`: any byte for integer inputs, [0, 1) for float ones."""
    if np.issubdtype(dtype, np.integer):
        return rng.integers(0, 256, shape).astype(dtype)
    return rng.random(shape).astype(dtype)


def _timed(step: Callable[[], object], seconds: int, precision: str) -> Run:
    """Call `step` until `seconds` are up, one call at a time; its rate and median latency."""
    latencies: list[float] = []
    begin = time.perf_counter()
    deadline = begin + seconds
    while (started := time.perf_counter()) < deadline:
        step()
        latencies.append(time.perf_counter() - started)
    return Run(
        fps=len(latencies) / (time.perf_counter() - begin),
        p50_ms=float(np.percentile(latencies, 50)) * 1e3,
        precision=precision,
        requests=1,
    )


class NaiveLoop:
    """The loop a user writes first: default compile, synchronous calls, one input."""

    def __init__(self, model: ModelUnderTest, precision: str | None) -> None:
        core = ov.Core()
        try:
            graph = core.read_model(str(model.path))
            graph.reshape({model.input_name: ov.PartialShape(list(model.shape))})
            config = {} if precision is None else {"INFERENCE_PRECISION_HINT": precision}
            self._compiled: Any = core.compile_model(graph, "CPU", config)
        except RuntimeError as exc:
            raise MeasureError(
                f"OpenVINO cannot compile {model.name}: {one_line(str(exc))}"
            ) from None
        rng = np.random.default_rng(0)
        self._feeds: dict[str, Any] = {
            port.get_any_name(): _noise(
                rng,
                [d.get_length() for d in port.get_partial_shape()],
                port.get_element_type().to_dtype(),
            )
            for port in self._compiled.inputs
        }
        self._precision = self._compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()
        self._compiled(self._feeds)  # The first call allocates; keep it out of the timing.

    def run(self, seconds: int) -> Run:
        compiled, feeds = self._compiled, self._feeds
        return _timed(lambda: compiled(feeds), seconds, self._precision)


class EngineLoop:
    """benchmark_app's latency loop in Python, on edge-agent's own graph: one infer request,
    run synchronously until the time is up. Run `fresh`, each run first writes the input
    into the request's tensors again (the same bytes, so the engine computes exactly what it
    does without), as a real caller writes its next frame; otherwise the input stays as it
    was written once, as benchmark_app's does."""

    def __init__(self, model: ModelUnderTest, graph: ov.Model, precision: str | None) -> None:
        config: dict[str, Any] = {"PERFORMANCE_HINT": "LATENCY"}
        if precision is not None:
            config["INFERENCE_PRECISION_HINT"] = precision
        try:
            compiled: Any = ov.Core().compile_model(graph, "CPU", config)
        except RuntimeError as exc:
            raise MeasureError(
                f"OpenVINO cannot compile edge-agent's graph of {model.name}: {one_line(str(exc))}"
            ) from None
        self._request: Any = compiled.create_infer_request()
        rng = np.random.default_rng(0)
        self._writes: list[tuple[Any, Any]] = []
        for port in compiled.inputs:
            tensor = self._request.get_tensor(port).data
            tensor[...] = _noise(rng, tensor.shape, tensor.dtype)
            self._writes.append((tensor, tensor.copy()))
        self._precision = compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()
        self._request.infer()  # The first run allocates; keep it out of the timing.

    def run(self, seconds: int, fresh: bool) -> Run:
        infer, copyto = self._request.infer, np.copyto
        writes = self._writes if fresh else []

        def step() -> None:
            for tensor, frame in writes:
                copyto(tensor, frame)
            infer()

        return _timed(step, seconds, self._precision)


def measure_model(
    model: ModelUnderTest,
    kinds: Sequence[str],
    seconds: int,
    rounds: int,
    precision: str | None,
    home: str,
    say: Say,
    hint: str = "throughput",
) -> tuple[dict[str, Measurement], list[str]]:
    """Every measurement of one model, alternating their order round by round.

    Returns:
        The measurements, and notes on how the tuned ONNX Runtime session was chosen.
    """
    measurements = {kind: Measurement(kind) for kind in kinds}
    notes: list[str] = []
    if model.format != "onnx":
        for kind in (EDGE_ORT, TUNED_ORT):
            if kind in measurements:
                measurements[kind].skipped = f"ONNX Runtime cannot read a {model.format} model"
    if not model.image and FOLDED_APP in measurements:
        measurements[FOLDED_APP].skipped = "an audio model: no frame preprocessing to fold"
    if hint != "latency":
        for kind in (READY_LOOP, FRESH_LOOP):
            if kind in measurements:
                measurements[kind].skipped = "one request at a time: run with --hint latency"
    naive: NaiveLoop | None = None
    tuned: OrtConfig | None = None
    folded: ModelUnderTest | None = None
    loop: EngineLoop | None = None
    built: tuple[ov.Model, Manifest] | None = None

    def graph() -> tuple[ov.Model, Manifest]:
        nonlocal built
        if built is None:
            built = edge_agent_graph(model, Path(home))
        return built

    def naive_run() -> Run:
        nonlocal naive
        if naive is None:
            naive = NaiveLoop(model, precision)
        return naive.run(seconds)

    def tuned_run() -> Run:
        nonlocal tuned
        if tuned is None:
            # Each grid point gets a short look; the winner is then measured like the rest.
            probe = min(2.0, max(0.25, seconds / 8))
            say(f"  tuning ONNX Runtime ({probe:.2f} s per setting, twice)")
            tuned, tried = tune_apart(model, probe)
            notes.append(f"{TUNED_ORT}: {tuned.label()}, best of {tried} settings")
        return run_apart(model, tuned, seconds)

    def folded_run() -> Run:
        nonlocal folded
        if folded is None:
            folded = folded_graph(model, *graph(), Path(home))
        return benchmark_app(folded, seconds, precision, home, hint)

    def engine_loop(fresh: bool) -> Run:
        nonlocal loop
        if loop is None:
            loop = EngineLoop(model, graph()[0], precision)
        return loop.run(seconds, fresh)

    steps: dict[str, Callable[[], Run]] = {
        EDGE_OV: lambda: edge_agent_bench(model, "openvino", seconds, precision, hint),
        BENCHMARK_APP: lambda: benchmark_app(model, seconds, precision, home, hint),
        FOLDED_APP: folded_run,
        READY_LOOP: lambda: engine_loop(False),
        FRESH_LOOP: lambda: engine_loop(True),
        EDGE_ORT: lambda: edge_agent_bench(model, "onnxruntime", seconds, precision, hint),
        TUNED_ORT: tuned_run,
        NAIVE: naive_run,
    }
    in_rounds(measurements, {k: steps[k] for k in kinds}, rounds, say)
    return measurements, notes


def edge_agent_graph(model: ModelUnderTest, folder: Path) -> tuple[ov.Model, Manifest]:
    """The graph edge-agent compiles for `model` (an image model's preprocessing folded in),
    and the model's manifest."""
    from edge_agent.catalog.catalog import Catalog, default_models_dir, looks_like_path
    from edge_agent.errors import EdgeAgentError
    from edge_agent.runtime.base import RuntimeOptions
    from edge_agent.runtime.openvino_backend import OpenVinoBackend

    try:
        catalog = Catalog(default_models_dir(), folder)
        # A model file (calibration's output) carries its manifest beside it; resolving a
        # path reads that, and never fetches.
        manifest = (
            catalog.resolve(model.name).manifest
            if looks_like_path(model.name)
            else catalog.manifest(model.name)
        )
        shape = model.shape if model.shape_overridden else None
        graph = OpenVinoBackend().prepared_model(model.path, manifest, RuntimeOptions(shape=shape))
    except EdgeAgentError as exc:
        raise MeasureError(f"cannot build edge-agent's graph of {model.name}: {exc}") from None
    return graph, manifest


def folded_graph(
    model: ModelUnderTest, graph: ov.Model, manifest: Manifest, folder: Path
) -> ModelUnderTest:
    """edge-agent's own `graph` of `model` (edge_agent_graph: preprocessing folded in), saved
    as an IR benchmark_app reads."""
    from edge_agent.catalog.manifest import ImageInput

    spec = manifest.input
    if not isinstance(spec, ImageInput):
        raise MeasureError(f"{model.name} is not an image model")
    xml = folder / f"{model.name}-folded.xml"
    ov.save_model(graph, str(xml), compress_to_fp16=False)
    fitted = spec.with_shape(model.shape if model.shape_overridden else None)
    frames = (fitted.shape[0], fitted.height, fitted.width, 3)
    return ModelUnderTest(model.name, xml, "ir", spec.name, frames)


def ratios(
    name: str,
    ms: dict[str, Measurement],
    precision: str | None = None,
    hint: str = "throughput",
) -> list[Ratio]:
    """edge-agent over each reference, where both were measured. The tuned ONNX Runtime
    session is tuned for throughput, so under the latency hint it is a figure, not a target."""
    found: list[Ratio] = []

    def add(ours: str, theirs: str, target: float | None) -> None:
        a, b = ms.get(ours), ms.get(theirs)
        if a is None or b is None or a.skipped is not None or b.skipped is not None:
            return
        found.append(Ratio(f"{ours} / {theirs}", ratio_of(a, b), target, noisy=noisy(a, b)))

    add(EDGE_OV, BENCHMARK_APP, TARGET_VS_BENCHMARK_APP)
    add(FOLDED_APP, BENCHMARK_APP, None)  # what folding the preprocessing in costs
    add(EDGE_OV, FOLDED_APP, None)  # what the Python around the engine costs, split below
    add(READY_LOOP, FOLDED_APP, None)  # the Python call
    folded = ms.get(FOLDED_APP)
    if folded is None or folded.skipped is not None:  # nothing to fold (audio)
        add(READY_LOOP, BENCHMARK_APP, None)
    add(FRESH_LOOP, READY_LOOP, None)  # the input written anew each run
    add(EDGE_OV, FRESH_LOOP, None)  # edge-agent's own bookkeeping
    add(EDGE_ORT, TUNED_ORT, TARGET_ORT_VS_TUNED if hint == "throughput" else None)
    add(EDGE_OV, EDGE_ORT, TARGET_OV_VS_ORT.get(name) if precision is None else None)
    add(EDGE_OV, NAIVE, None)
    return found


def _parse_shapes(values: Sequence[str]) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {}
    for value in values:
        name, _, dims = value.partition("=")
        try:
            shapes[name] = tuple(int(d) for d in dims.split(","))
        except ValueError:
            raise SystemExit(f"error: --shape {value!r}: want MODEL=1,3,640,640") from None
    return shapes


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS), help="model names")
    parser.add_argument(
        "--time", type=float, default=16.0, help="seconds per measurement, over all rounds"
    )
    parser.add_argument("--rounds", type=int, default=2, help="rounds, order reversed each time")
    parser.add_argument(
        "--compare",
        choices=sorted(COMPARE),
        default="all",
        help="openvino: edge-agent OV against benchmark_app, the engine loops and the naive "
        "loop; onnxruntime: edge-agent ORT against the tuned ORT session; all: both (default)",
    )
    parser.add_argument("--precision", choices=("f32", "bf16", "f16"), default=None)
    parser.add_argument(
        "--hint",
        choices=("throughput", "latency"),
        default="throughput",
        help="the performance hint edge-agent and benchmark_app both run under; the naive "
        "loop and the tuned ONNX Runtime session have none",
    )
    parser.add_argument(
        "--shape", action="append", default=[], help="MODEL=1,3,736,736 (default: the manifest's)"
    )
    parser.add_argument("--json", type=Path, default=None, help="write every figure here")
    args = parser.parse_args(argv)
    shapes = _parse_shapes(args.shape)
    rounds = max(1, args.rounds)
    # benchmark_app takes whole seconds; everyone gets the same.
    seconds = max(1, round(args.time / rounds))

    console, status = consoles(110)
    import onnxruntime

    report = print_machine(
        console, {"OpenVINO": ov.get_version(), "ONNX Runtime": onnxruntime.__version__}
    )
    console.print(
        f"{rounds} round(s) of {seconds} s per measurement; precision: "
        f"{args.precision or 'device default'}; hint: {args.hint}"
    )
    report.update(
        seconds_per_run=seconds, rounds=rounds, precision=args.precision, hint=args.hint, models={}
    )
    status_code = 0
    with tempfile.TemporaryDirectory(prefix="bench-runtime-") as tmp:
        home = quiet_home(Path(tmp))
        for name in args.models:
            status.print(f"[bold]{name}[/]")
            try:
                model = describe(name, shapes.get(name), audio=True)
            except MeasureError as exc:
                status.print(f"[red]error:[/] {name}: {exc}")
                status_code = 2
                continue
            measurements, notes = measure_model(
                model,
                COMPARE[args.compare],
                seconds,
                rounds,
                args.precision,
                home,
                status.print,
                args.hint,
            )
            found = ratios(name, measurements, args.precision, args.hint)
            shape = "x".join(str(d) for d in model.shape)
            precision = args.precision or "each one's device default"
            console.print(
                figure_table(
                    f"{model.name} ({model.format}, {shape}) on CPU",
                    list(measurements.values()),
                    [*notes, f"precision: {precision}", "FPS: median of the rounds"],
                )
            )
            console.print(
                ratio_table(
                    f"{model.name}: throughput ratios",
                    found,
                    notes=["value: median of the round-by-round ratios"],
                )
            )
            if any(m.error is not None for m in measurements.values()):
                status_code = 2
            elif any(r.passed is False for r in found) and status_code == 0:
                status_code = 1
            report["models"][name] = {
                "path": str(model.path),
                "format": model.format,
                "shape": list(model.shape),
                "notes": notes,
                "measurements": {m.name: m.to_json() for m in measurements.values()},
                "ratios": [r.to_json() for r in found],
            }
    finish(console, report, args.json)
    return status_code


if __name__ == "__main__":
    sys.exit(main())
