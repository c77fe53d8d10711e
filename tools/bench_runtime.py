"""How fast edge-agent runs a model, against the reference points a user would compare it with.

For each model, in one run, on the CPU:

1. `edge-agent bench --backend openvino --hint throughput` (the agent's own path, with the
   frame preprocessing folded into the graph);
2. OpenVINO's `benchmark_app -hint throughput` on the same model file and input shape;
3. `edge-agent bench --backend onnxruntime`, for ONNX models (skipped, with the reason, for
   TF and TFLite);
4. the naive loop a user would write: `core.compile_model(model, "CPU")` with no hints, then
   `compiled(x)` synchronously on one random input until the time is up.

It prints throughput (FPS) and median latency of each, beside the inference precision each one
ran at, and the ratios the runtime is held to: edge-agent / benchmark_app >= 0.95 and, on
text-det-ppocr, edge-agent OpenVINO / ONNX Runtime >= 2.5. Each measurement runs `--rounds`
times for `--time / --rounds` seconds, in the opposite order every other round, so a slow
drift of the machine does not favour whichever runs first; a ratio whose rounds disagree by
more than 15% is flagged noisy, and the load average is printed before and after.

Run it from the checkout, with the models already fetched:

    EDGE_AGENT_CACHE=/tmp/eacache python tools/bench_runtime.py
    python tools/bench_runtime.py --models text-det-ppocr --time 30 --precision f32 --json out.json

`--precision` forces the precision everywhere (`--precision`, `-infer_precision` and
INFERENCE_PRECISION_HINT); without it each one runs at the device default.

Exit status: 0 when every figure was measured and every target met, 1 when a target was
missed, 2 when a measurement failed.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import openvino as ov
from rich.console import Console
from rich.table import Table

BIN = Path(sys.executable).parent
DEFAULT_MODELS = ("text-det-ppocr", "person-ssdlite")
# Model format -> whether ONNX Runtime can read it.
ONNX_FORMATS = {"onnx"}
# Targets on edge-agent's OpenVINO throughput over each reference; models missing from a
# target's table are reported without a verdict.
TARGET_VS_BENCHMARK_APP = 0.95
TARGET_VS_ONNXRUNTIME = {"text-det-ppocr": 2.5}
# Rounds of one measurement further apart than this mean something else was using the CPU.
NOISY_SPREAD = 1.15
_OV_PRECISION = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}

EDGE_OV = "edge-agent OV"
BENCHMARK_APP = "benchmark_app"
EDGE_ORT = "edge-agent ORT"
NAIVE = "naive loop"
KINDS = (EDGE_OV, BENCHMARK_APP, EDGE_ORT, NAIVE)


class MeasureError(Exception):
    """A measurement could not be taken; the message is one line."""


@dataclass(frozen=True, slots=True)
class ModelUnderTest:
    """What every measurement needs to know about a model."""

    name: str
    path: Path
    format: str
    input_name: str
    shape: tuple[int, ...]
    shape_overridden: bool


@dataclass(frozen=True, slots=True)
class Run:
    """One timed run of one measurement."""

    iterations: int
    seconds: float
    p50_ms: float
    precision: str
    requests: int


@dataclass(slots=True)
class Measurement:
    """All rounds of one kind of measurement on one model."""

    kind: str
    runs: list[Run] = field(default_factory=list)
    error: str | None = None
    skipped: str | None = None

    @property
    def fps(self) -> float | None:
        if not self.runs or self.error is not None:
            return None
        return sum(r.iterations for r in self.runs) / sum(r.seconds for r in self.runs)

    @property
    def p50_ms(self) -> float | None:
        if not self.runs or self.error is not None:
            return None
        return float(np.mean([r.p50_ms for r in self.runs]))

    @property
    def spread(self) -> float:
        """Fastest round over slowest: how much the machine moved under this measurement."""
        rates = [r.iterations / r.seconds for r in self.runs]
        return max(rates) / min(rates) if rates and min(rates) > 0 else 1.0


@dataclass(frozen=True, slots=True)
class Ratio:
    """edge-agent's OpenVINO throughput over a reference, with its target if it has one."""

    name: str
    value: float | None
    target: float | None
    noisy: bool

    @property
    def passed(self) -> bool | None:
        if self.value is None or self.target is None:
            return None
        return self.value >= self.target


def one_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def run_command(argv: Sequence[str], env: dict[str, str] | None = None) -> str:
    """Run a command and return its stdout; a failure becomes a one-line MeasureError."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    except OSError as exc:
        raise MeasureError(f"cannot run {argv[0]}: {exc.strerror}") from None
    if done.returncode != 0:
        detail = one_line(done.stderr or done.stdout)
        raise MeasureError(f"{Path(argv[0]).name} exited {done.returncode}: {detail}")
    return done.stdout


def describe(name: str, shape: tuple[int, ...] | None) -> ModelUnderTest:
    """Ask `edge-agent models info` where the model file is and what its input looks like."""
    out = run_command([str(BIN / "edge-agent"), "models", "info", name])
    try:
        info: dict[str, Any] = json.loads(out)
        manifest = info["manifest"]
        spec = manifest["input"]
    except (json.JSONDecodeError, KeyError, TypeError):
        raise MeasureError(f"edge-agent models info {name} printed no manifest") from None
    if spec.get("kind") != "image":
        raise MeasureError(f"{name} is not an image model; only image models are benchmarked")
    if not info.get("fetched", True):
        raise MeasureError(f"{name} is not fetched; run `edge-agent models fetch {name}`")
    return ModelUnderTest(
        name=name,
        path=Path(info["path"]),
        format=manifest["format"],
        input_name=spec["name"],
        shape=shape or tuple(spec["shape"]),
        shape_overridden=shape is not None,
    )


def edge_agent_bench(
    model: ModelUnderTest, backend: str, seconds: int, precision: str | None
) -> Run:
    """`edge-agent bench --json` in its own process."""
    argv = [str(BIN / "edge-agent"), "bench", "--model", model.name, "--backend", backend]
    argv += ["--hint", "throughput", "--time", str(seconds), "--json"]
    if precision is not None:
        argv += ["--precision", precision]
    if model.shape_overridden:
        argv += ["--shape", ",".join(str(d) for d in model.shape)]
    out = run_command(argv)
    try:
        result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        return Run(
            iterations=int(result["iterations"]),
            seconds=float(result["seconds"]),
            p50_ms=float(result["latency_ms"]["p50"]),
            precision=str(result["compile"]["precision"]),
            requests=int(result["compile"]["requests"]),
        )
    except (json.JSONDecodeError, IndexError, KeyError, TypeError, ValueError):
        raise MeasureError(f"edge-agent bench printed no result: {one_line(out)}") from None


def _quiet_home() -> str:
    """A HOME whose OpenVINO telemetry consent file says no, for benchmark_app."""
    home = Path(tempfile.mkdtemp(prefix="bench-runtime-home-"))
    atexit.register(shutil.rmtree, home, True)
    (home / "intel").mkdir()
    (home / "intel" / "openvino_telemetry").write_text("0\n")
    return str(home)


def grab(pattern: str, text: str) -> str:
    found = re.search(pattern, text, re.MULTILINE)
    if found is None:
        raise MeasureError(f"benchmark_app output has no match for {pattern!r}")
    return found.group(1)


def benchmark_app(model: ModelUnderTest, seconds: int, precision: str | None, home: str) -> Run:
    """OpenVINO's benchmark_app on the model file itself, at the same shape."""
    shape = f"{model.input_name}[{','.join(str(d) for d in model.shape)}]"
    argv = [str(BIN / "benchmark_app"), "-m", str(model.path), "-d", "CPU"]
    argv += ["-hint", "throughput", "-t", str(seconds), "-shape", shape]
    if precision is not None:
        argv += ["-infer_precision", precision]
    out = run_command(argv, env={**os.environ, "HOME": home})
    ov_type = grab(r"INFERENCE_PRECISION_HINT: <Type: '(\w+)'>", out)
    return Run(
        iterations=int(grab(r"Count:\s+(\d+) iterations", out)),
        seconds=float(grab(r"Duration:\s+([\d.]+) ms", out)) / 1e3,
        p50_ms=float(grab(r"Median:\s+([\d.]+) ms", out)),
        precision=_OV_PRECISION.get(ov_type, ov_type),
        requests=int(grab(r"asynchronously, (\d+) inference requests", out)),
    )


class NaiveLoop:
    """The loop a user writes first: default compile, synchronous calls, one input."""

    def __init__(self, core: ov.Core, model: ModelUnderTest, precision: str | None) -> None:
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
        self._feeds: dict[str, Any] = {}
        for port in self._compiled.inputs:
            dtype = port.get_element_type().to_dtype()
            dims = [d.get_length() for d in port.get_partial_shape()]
            if np.issubdtype(dtype, np.integer):
                self._feeds[port.get_any_name()] = rng.integers(0, 256, dims).astype(dtype)
            else:
                self._feeds[port.get_any_name()] = rng.random(dims).astype(dtype)
        self._precision = self._compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()
        self._compiled(self._feeds)  # The first call allocates; keep it out of the timing.

    def run(self, seconds: int) -> Run:
        latencies: list[float] = []
        begin = time.perf_counter()
        deadline = begin + seconds
        while (started := time.perf_counter()) < deadline:
            self._compiled(self._feeds)
            latencies.append(time.perf_counter() - started)
        elapsed = time.perf_counter() - begin
        return Run(
            iterations=len(latencies),
            seconds=elapsed,
            p50_ms=float(np.percentile(latencies, 50)) * 1e3,
            precision=self._precision,
            requests=1,
        )


def measure_model(
    model: ModelUnderTest,
    seconds: int,
    rounds: int,
    precision: str | None,
    core: ov.Core,
    home: str,
    say: Callable[[str], None],
) -> dict[str, Measurement]:
    """Every measurement of one model, alternating their order round by round."""
    measurements = {kind: Measurement(kind) for kind in KINDS}
    if model.format not in ONNX_FORMATS:
        measurements[EDGE_ORT].skipped = f"ONNX Runtime cannot read a {model.format} model"
    naive: NaiveLoop | None = None

    def naive_run(s: int) -> Run:
        nonlocal naive
        if naive is None:
            naive = NaiveLoop(core, model, precision)
        return naive.run(s)

    steps: dict[str, Callable[[int], Run]] = {
        EDGE_OV: lambda s: edge_agent_bench(model, "openvino", s, precision),
        BENCHMARK_APP: lambda s: benchmark_app(model, s, precision, home),
        EDGE_ORT: lambda s: edge_agent_bench(model, "onnxruntime", s, precision),
        NAIVE: naive_run,
    }
    for index in range(rounds):
        order = KINDS if index % 2 == 0 else tuple(reversed(KINDS))
        for kind in order:
            m = measurements[kind]
            if m.skipped is not None or m.error is not None:
                continue
            say(f"  round {index + 1}/{rounds}: {kind}")
            try:
                m.runs.append(steps[kind](seconds))
            except MeasureError as exc:
                m.error = str(exc)
                say(f"[red]error:[/] {model.name}: {kind}: {exc}")
    return measurements


def ratios(name: str, measurements: dict[str, Measurement]) -> list[Ratio]:
    """edge-agent OpenVINO throughput over each reference."""
    ours = measurements[EDGE_OV].fps

    def over(kind: str, target: float | None) -> Ratio:
        theirs = measurements[kind].fps
        value = None if ours is None or not theirs else ours / theirs
        noisy = max(measurements[EDGE_OV].spread, measurements[kind].spread) > NOISY_SPREAD
        return Ratio(f"{EDGE_OV} / {kind}", value, target, noisy)

    found = [over(BENCHMARK_APP, TARGET_VS_BENCHMARK_APP)]
    if measurements[EDGE_ORT].skipped is None:
        found.append(over(EDGE_ORT, TARGET_VS_ONNXRUNTIME.get(name)))
    found.append(over(NAIVE, None))
    return found


def _precision_label(m: Measurement, forced: str | None) -> str:
    seen = "/".join(sorted({r.precision for r in m.runs}))
    return f"{seen} forced" if forced is not None else f"{seen} device default"


def render(
    model: ModelUnderTest,
    measurements: dict[str, Measurement],
    found: list[Ratio],
    forced: str | None,
) -> list[Table]:
    """One table of figures and one of ratios for a model."""
    shape = "x".join(str(d) for d in model.shape)
    notes = [
        f"{m.kind}: {m.skipped or m.error}"
        for m in measurements.values()
        if m.skipped is not None or m.error is not None
    ]
    figures = Table(
        title=f"{model.name} ({model.format}, {shape}) on CPU",
        caption="\n".join(notes) or None,
        caption_justify="left",
    )
    for column in ("measurement", "FPS", "p50 ms", "precision", "nireq", "FPS per round"):
        figures.add_column(column, justify="left" if column == "measurement" else "right")
    for m in measurements.values():
        if m.fps is None or m.p50_ms is None:
            state = "[dim]skipped[/]" if m.skipped is not None else "[red]failed[/]"
            figures.add_row(m.kind, "—", "—", "—", "—", state)
            continue
        figures.add_row(
            m.kind,
            f"{m.fps:.1f}",
            f"{m.p50_ms:.2f}",
            _precision_label(m, forced),
            "/".join(str(r) for r in sorted({r.requests for r in m.runs})),
            " / ".join(f"{r.iterations / r.seconds:.1f}" for r in m.runs),
        )
    table = Table(title=f"{model.name}: throughput ratios")
    for column in ("ratio", "value", "target", "result"):
        table.add_column(column, justify="left" if column == "ratio" else "right")
    for r in found:
        value = "—" if r.value is None else f"{r.value:.2f}x"
        target = "—" if r.target is None else f">= {r.target:.2f}x"
        verdict = {True: "[green]pass[/]", False: "[red]FAIL[/]", None: "[dim]info[/]"}[r.passed]
        if r.noisy:
            verdict += " [yellow](noisy)[/]"
        table.add_row(r.name, value, target, verdict)
    if any(r.noisy for r in found):
        table.caption = (
            f"noisy: rounds of a measurement differ by more than {NOISY_SPREAD - 1:.0%}; "
            "rerun on an idle machine"
        )
        table.caption_justify = "left"
    return [figures, table]


def cpu_name() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown"
    found = re.search(r"^model name\s*:\s*(.+)$", text, re.MULTILINE)
    return found.group(1).strip() if found else "unknown"


def load_average() -> str:
    """The 1, 5 and 15 minute load averages: anything else running skews every figure."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


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
    parser.add_argument("--precision", choices=("f32", "bf16", "f16"), default=None)
    parser.add_argument(
        "--shape", action="append", default=[], help="MODEL=1,3,736,736 (default: the manifest's)"
    )
    parser.add_argument("--json", type=Path, default=None, help="write every figure here")
    args = parser.parse_args(argv)
    shapes = _parse_shapes(args.shape)
    rounds = max(1, args.rounds)
    # benchmark_app takes whole seconds; everyone gets the same.
    seconds = max(1, round(args.time / rounds))

    # Piped output (a log, CI) gets room for the tables instead of rich's 80 columns.
    console = Console(width=None if sys.stdout.isatty() else 100)
    status = Console(stderr=True, soft_wrap=True)
    import onnxruntime  # Only for its version: the measurement itself runs in edge-agent.

    console.print(f"CPU: {cpu_name()} ({os.cpu_count()} logical)")
    console.print(f"OpenVINO {ov.get_version()}, ONNX Runtime {onnxruntime.__version__}")
    console.print(f"load average before: {load_average()}")
    console.print(
        f"{rounds} round(s) of {seconds} s per measurement; precision: "
        f"{args.precision or 'device default'}"
    )

    load_before = load_average()
    core = ov.Core()
    home = _quiet_home()
    report: dict[str, Any] = {
        "cpu": cpu_name(),
        "openvino": ov.get_version(),
        "onnxruntime": onnxruntime.__version__,
        "seconds_per_run": seconds,
        "rounds": rounds,
        "precision": args.precision,
        "models": {},
    }
    status_code = 0
    for name in args.models:
        status.print(f"[bold]{name}[/]")
        try:
            model = describe(name, shapes.get(name))
        except MeasureError as exc:
            status.print(f"[red]error:[/] {name}: {exc}")
            status_code = 2
            continue
        measurements = measure_model(
            model, seconds, rounds, args.precision, core, home, status.print
        )
        found = ratios(name, measurements)
        for table in render(model, measurements, found, args.precision):
            console.print(table)
        if any(m.error is not None for m in measurements.values()):
            status_code = 2
        elif any(r.passed is False for r in found) and status_code == 0:
            status_code = 1
        report["models"][name] = {
            "path": str(model.path),
            "format": model.format,
            "shape": list(model.shape),
            "measurements": {
                m.kind: {
                    "fps": m.fps,
                    "p50_ms": m.p50_ms,
                    "runs": [asdict(r) for r in m.runs],
                    "spread": m.spread,
                    "error": m.error,
                    "skipped": m.skipped,
                }
                for m in measurements.values()
            },
            "ratios": [
                {
                    "name": r.name,
                    "value": r.value,
                    "target": r.target,
                    "passed": r.passed,
                    "noisy": r.noisy,
                }
                for r in found
            ],
        }
    console.print(f"load average after: {load_average()}")
    report["load_average"] = {"before": load_before, "after": load_average()}
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        console.print(f"wrote {args.json}")
    return status_code


if __name__ == "__main__":
    sys.exit(main())
