"""What the benchmark scripts share: the machine, the tools they run, rounds, ratios, tables.

Every figure is a `Measurement` of several `Run`s, taken in rounds whose order reverses every
other round, so a slow drift of the machine favours nobody; a figure is the median of its
rounds, a ratio the median of the round-by-round ratios. Each run records the load average
when it ended, and every figure table shows it beside the figure, with the CPU flags that
decide what the figures mean (VNNI for INT8, BF16 for the default precision) in its caption.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

BIN = Path(sys.executable).parent
# Rounds of one measurement further apart than this mean something else was using the CPU.
NOISY_SPREAD = 1.15
OV_PRECISION = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}
# CPU flags any of which gives the INT8 dot-product instructions INT8 speed-ups assume.
VNNI_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")
BF16_FLAGS = ("avx512_bf16", "amx_bf16")
SHOWN_FLAGS = ("avx2", "avx512f", *VNNI_FLAGS, *BF16_FLAGS, "amx_tile")

Say = Callable[[str], None]


class MeasureError(Exception):
    """A measurement could not be taken; the message is one line."""


def one_line(text: str) -> str:
    """The last non-empty line of a tool's output: usually what went wrong."""
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


def grab(pattern: str, text: str) -> str:
    """The first group of `pattern` in a tool's output, or a MeasureError saying it is missing."""
    found = re.search(pattern, text, re.MULTILINE)
    if found is None:
        raise MeasureError(f"tool output has no match for {pattern!r}")
    return found.group(1)


# --- the machine -------------------------------------------------------------------------


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def cpu_name() -> str:
    found = re.search(r"^model name\s*:\s*(.+)$", _cpuinfo(), re.MULTILINE)
    return found.group(1).strip() if found else "unknown"


def cpu_flags() -> dict[str, bool]:
    """Which of the flags the figures depend on this CPU reports."""
    found = re.search(r"^flags\s*:\s*(.*)$", _cpuinfo(), re.MULTILINE)
    flags = set(found.group(1).split()) if found else set()
    return {name: name in flags for name in SHOWN_FLAGS}


def flags_text(flags: dict[str, bool]) -> str:
    have = [name for name in SHOWN_FLAGS if flags.get(name)]
    lack = [name for name in SHOWN_FLAGS if not flags.get(name)]
    lacks = f"; lacks {' '.join(lack)}" if lack else ""
    return f"CPU flags: {' '.join(have) or 'none of these'}{lacks}"


def load_1m() -> float:
    """The 1-minute load average: anything else running skews every figure."""
    return os.getloadavg()[0]


def load_average() -> str:
    """The 1, 5 and 15 minute load averages."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def print_machine(console: Console, versions: dict[str, str]) -> dict[str, Any]:
    """Print what the figures depend on; return it for the JSON report."""
    flags = cpu_flags()
    console.print(f"CPU: {cpu_name()} ({os.cpu_count()} logical)")
    console.print(flags_text(flags))
    console.print(", ".join(f"{name} {version}" for name, version in versions.items()))
    before = load_average()
    console.print(f"load average before: {before}")
    return {
        "cpu": cpu_name(),
        "logical_cpus": os.cpu_count(),
        "cpu_flags": flags,
        **versions,
        "load_average": {"before": before},
    }


def quiet_home(root: Path) -> str:
    """A HOME whose OpenVINO telemetry consent file says no, for benchmark_app."""
    home = root / "home"
    (home / "intel").mkdir(parents=True, exist_ok=True)
    (home / "intel" / "openvino_telemetry").write_text("0\n")
    return str(home)


@contextlib.contextmanager
def quiet_nncf() -> Iterator[None]:
    """NNCF's logging down, and its progress bars (drawn on stdout) sent to stderr."""
    # NNCF is slow to import; only the scripts that quantize pay for it.
    from edge_agent.quantize.calibrate import quiet_nncf as quiet

    with quiet(), contextlib.redirect_stdout(sys.stderr):
        yield


# --- what is measured --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ModelUnderTest:
    """What every measurement needs to know about a model."""

    name: str
    path: Path
    format: str
    input_name: str
    shape: tuple[int, ...]
    shape_overridden: bool = False
    image: bool = True
    """False for an audio model (vad-silero): its other inputs (the state) keep their shapes."""
    quantization: str | None = None
    """The calibration rung a calibrated model won (int8, weights-int8...); None otherwise."""

    def as_file(self, path: Path) -> ModelUnderTest:
        """The same input, from an IR file (its name is its path, for edge-agent)."""
        return ModelUnderTest(str(path), path, "ir", self.input_name, self.shape, image=self.image)


def describe(
    name: str, shape: tuple[int, ...] | None = None, audio: bool = False
) -> ModelUnderTest:
    """Ask `edge-agent models info` where the model file is and what its input looks like.

    Args:
        audio: take an audio model too (its input: one window of samples with context).
    """
    out = run_command([str(BIN / "edge-agent"), "models", "info", name])
    try:
        info: dict[str, Any] = json.loads(out)
        manifest = info["manifest"]
        spec = manifest["input"]
    except (json.JSONDecodeError, KeyError, TypeError):
        raise MeasureError(f"edge-agent models info {name} printed no manifest") from None
    kind = spec.get("kind")
    if kind not in ("image", "audio") or (kind == "audio" and not audio):
        raise MeasureError(f"{name} is a {kind} model; this benchmark takes image models")
    if not info.get("fetched", True):
        raise MeasureError(f"{name} is not fetched; run `edge-agent models fetch {name}`")
    if kind == "image":
        own: tuple[int, ...] = tuple(spec["shape"])
    else:
        # One window, with the context the head prepends, as the VAD feeds it.
        head = manifest.get("head") or {}
        own = (1, int(head.get("window", 512)) + int(head.get("context", 0)))
    return ModelUnderTest(
        name=name,
        path=Path(info["path"]),
        format=manifest["format"],
        input_name=spec["name"],
        shape=shape or own,
        shape_overridden=shape is not None,
        image=kind == "image",
        quantization=(manifest.get("quantization") or {}).get("mode"),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    """One timed run of one measurement."""

    fps: float
    p50_ms: float | None = None
    p95_ms: float | None = None
    precision: str | None = None
    requests: int | None = None
    load: float = field(default_factory=load_1m)
    """1-minute load average when the run ended."""
    iterations: int | None = None
    """Requests completed, where the tool says (benchmark_app)."""


@dataclass(slots=True)
class Measurement:
    """All rounds of one measurement."""

    name: str
    runs: list[Run] = field(default_factory=list)
    precision: str | None = None
    """For runs that do not report their own."""
    requests: int | None = None
    """For runs that do not report their own."""
    error: str | None = None
    skipped: str | None = None

    @property
    def ok(self) -> bool:
        return bool(self.runs) and self.error is None

    @property
    def fps(self) -> float | None:
        return statistics.median(r.fps for r in self.runs) if self.ok else None

    def median_of(self, pick: Callable[[Run], float | None]) -> float | None:
        values = [v for r in self.runs if (v := pick(r)) is not None] if self.ok else []
        return statistics.median(values) if values else None

    @property
    def spread(self) -> float:
        """Fastest round over slowest: how much the machine moved under this measurement."""
        rates = [r.fps for r in self.runs]
        return max(rates) / min(rates) if rates and min(rates) > 0 else 1.0

    @property
    def median_run(self) -> Run | None:
        """The round whose FPS is the median (the lower middle one of an even count)."""
        if not self.ok:
            return None
        return sorted(self.runs, key=lambda r: r.fps)[(len(self.runs) - 1) // 2]

    def attempt(self, step: Callable[[], Run], say: Say) -> None:
        """One more run, unless this measurement is skipped or has failed already."""
        if self.error is not None or self.skipped is not None:
            return
        try:
            self.runs.append(step())
        except MeasureError as exc:
            self.error = str(exc)
            say(f"[red]error:[/] {self.name}: {exc}")

    def to_json(self) -> dict[str, Any]:
        return {
            "fps": self.fps,
            "precision": self.precision,
            "spread": self.spread,
            "runs": [asdict(r) for r in self.runs],
            "error": self.error,
            "skipped": self.skipped,
        }


def in_rounds(
    measurements: dict[str, Measurement],
    steps: dict[str, Callable[[], Run]],
    rounds: int,
    say: Say,
) -> None:
    """Run each step once a round, in the opposite order every other round."""
    kinds = list(steps)
    for index in range(rounds):
        for kind in kinds if index % 2 == 0 else kinds[::-1]:
            m = measurements[kind]
            if m.error is None and m.skipped is None:
                say(f"  round {index + 1}/{rounds}: {kind}")
                m.attempt(steps[kind], say)


def edge_agent_bench(
    model: ModelUnderTest,
    backend: str,
    seconds: int,
    precision: str | None,
    hint: str = "throughput",
) -> Run:
    """`edge-agent bench --json --hint HINT` in its own process."""
    argv = [str(BIN / "edge-agent"), "bench", "--model", model.name, "--backend", backend]
    argv += ["--hint", hint, "--time", str(seconds), "--json"]
    if precision is not None:
        argv += ["--precision", precision]
    if model.shape_overridden:
        argv += ["--shape", ",".join(str(d) for d in model.shape)]
    out = run_command(argv)
    try:
        result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        fps = result.get("throughput_fps") or int(result["iterations"]) / float(result["seconds"])
        return Run(
            fps=float(fps),
            p50_ms=float(result["latency_ms"]["p50"]),
            precision=str(result["compile"]["precision"]),
            requests=int(result["compile"]["requests"]),
        )
    except (json.JSONDecodeError, IndexError, KeyError, TypeError, ValueError):
        raise MeasureError(f"edge-agent bench printed no result: {one_line(out)}") from None


def benchmark_app(
    model: ModelUnderTest,
    seconds: int,
    precision: str | None,
    home: str,
    hint: str = "throughput",
    inputs: Path | None = None,
) -> Run:
    """OpenVINO's benchmark_app on the model file itself, at the same shape.

    Args:
        inputs: a folder of images to feed instead of random data.
    """
    shape = f"{model.input_name}[{','.join(str(d) for d in model.shape)}]"
    argv = [str(BIN / "benchmark_app"), "-m", str(model.path), "-d", "CPU"]
    argv += ["-hint", hint, "-t", str(seconds), "-shape", shape]
    if precision is not None:
        argv += ["-infer_precision", precision]
    if inputs is not None:
        argv += ["-i", str(inputs)]
    if hint == "latency":
        argv += ["-latency_percentile", "95"]
    out = run_command(argv, env={**os.environ, "HOME": home})
    ov_type = grab(r"INFERENCE_PRECISION_HINT: <Type: '(\w+)'>", out)
    iterations = int(grab(r"Count:\s+(\d+) iterations", out))
    duration_s = float(grab(r"Duration:\s+([\d.]+) ms", out)) / 1e3
    requests = re.search(r"asynchronously, (\d+) inference requests", out)
    percentile = "95 percentile" if hint == "latency" else "Median"
    # benchmark_app prints a latency under a millisecond in "us" and the rest in "ms".
    found = re.search(rf"{percentile}:\s+([\d.]+) (ms|us)", out)
    if found is None:
        raise MeasureError(f"tool output has no {percentile} latency")
    latency = float(found.group(1)) / (1e3 if found.group(2) == "us" else 1.0)
    return Run(
        fps=iterations / duration_s,
        p50_ms=None if hint == "latency" else latency,
        p95_ms=latency if hint == "latency" else None,
        precision=OV_PRECISION.get(ov_type, ov_type),
        requests=int(requests.group(1)) if requests else 1,
        iterations=iterations,
    )


# --- ratios and tables -------------------------------------------------------------------


def ratio_of(a: Measurement, b: Measurement) -> float | None:
    """a over b: the median of the round-by-round ratios, else the ratio of the medians."""
    if a.fps is None or not b.fps:
        return None
    if len(a.runs) == len(b.runs) and all(r.fps > 0 for r in b.runs):
        return statistics.median(x.fps / y.fps for x, y in zip(a.runs, b.runs, strict=True))
    return a.fps / b.fps


def noisy(*measurements: Measurement) -> bool:
    return any(m.spread > NOISY_SPREAD for m in measurements)


@dataclass(frozen=True, slots=True)
class Ratio:
    """A derived figure, with its target if it has one."""

    name: str
    value: float | None
    target: float | None = None
    at_least: bool = True
    unit: str = "x"
    noisy: bool = False
    applies: bool = True
    """False: the target is shown, not judged (the CPU lacks what it assumes)."""
    reference: float | None = None
    """The same ratio on a reference tool, shown beside it when the table has the column."""

    @property
    def passed(self) -> bool | None:
        if self.value is None or self.target is None or not self.applies:
            return None
        return self.value >= self.target if self.at_least else self.value <= self.target

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "passed": self.passed}

    def text(self, value: float | None) -> str:
        if value is None:
            return "—"
        if self.unit == "x":
            return f"{value:.2f}x"
        return f"{value:.4f}" if self.unit == "" else f"{value:.1f} {self.unit}"


def ratio_table(
    title: str, ratios: Sequence[Ratio], reference: str | None = None, notes: Sequence[str] = ()
) -> Table:
    """Ratios, their targets and verdicts; `reference` names a column of Ratio.reference."""
    table = Table(title=title)
    columns = ["ratio", "value", *([reference] if reference else []), "target", "result"]
    for column in columns:
        table.add_column(column, justify="left" if column == "ratio" else "right")
    for r in ratios:
        bound = ">= " if r.at_least else "<= "
        target = "—" if r.target is None else bound + r.text(r.target)
        if r.target is not None and not r.applies:
            verdict = "[dim]n/a on this CPU[/]"
        else:
            verdict = {True: "[green]pass[/]", False: "[red]FAIL[/]", None: "[dim]info[/]"}[
                r.passed
            ]
        if r.noisy:
            verdict += " [yellow](noisy)[/]"
        extra = [r.text(r.reference)] if reference else []
        table.add_row(r.name, r.text(r.value), *extra, target, verdict)
    captions = list(notes)
    if any(r.noisy for r in ratios):
        captions.append(
            f"noisy: rounds of a measurement differ by more than {NOISY_SPREAD - 1:.0%}; "
            "rerun on an idle machine"
        )
    if captions:
        table.caption = "\n".join(captions)
        table.caption_justify = "left"
    return table


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def load_text(m: Measurement) -> str:
    loads = [r.load for r in m.runs]
    if not loads:
        return "—"
    low, high = min(loads), max(loads)
    return f"{low:.2f}" if high - low < 0.005 else f"{low:.2f}-{high:.2f}"


def figure_table(title: str, measurements: Sequence[Measurement], notes: Sequence[str]) -> Table:
    """FPS, latency, precision and requests of each measurement, with the load beside it."""
    problems = [
        f"{m.name}: {m.skipped or m.error}"
        for m in measurements
        if m.skipped is not None or m.error is not None
    ]
    caption = [*problems, *notes, flags_text(cpu_flags()),
               "load: 1-minute load average at the end of each round (min-max)"]  # fmt: skip
    table = Table(title=title, caption="\n".join(caption), caption_justify="left")
    columns = ("measurement", "FPS", "p50 ms", "p95 ms", "precision", "nireq", "load",
               "FPS per round")  # fmt: skip
    for column in columns:
        table.add_column(column, justify="left" if column == "measurement" else "right")
    for m in measurements:
        if m.fps is None:
            state = "[dim]skipped[/]" if m.skipped is not None else "[red]failed[/]"
            table.add_row(m.name, *(["—"] * 6), state)
            continue
        precisions = sorted({r.precision for r in m.runs if r.precision is not None})
        requests = sorted({r.requests for r in m.runs if r.requests is not None})
        if not requests and m.requests is not None:
            requests = [m.requests]
        table.add_row(
            m.name,
            f"{m.fps:.1f}",
            _ms(m.median_of(lambda r: r.p50_ms)),
            _ms(m.median_of(lambda r: r.p95_ms)),
            "/".join(precisions) or m.precision or "—",
            "/".join(str(r) for r in requests) or "—",
            load_text(m),
            " / ".join(f"{r.fps:.1f}" for r in m.runs),
        )
    return table


def finish(console: Console, report: dict[str, Any], out: Path | None) -> None:
    """Print the load average after; write the JSON report (from print_machine) if asked."""
    after = load_average()
    console.print(f"load average after: {after}")
    report.setdefault("load_average", {})["after"] = after
    if out is not None:
        out.write_text(json.dumps(report, indent=2) + "\n")
        console.print(f"wrote {out}")


def consoles(width: int) -> tuple[Console, Console]:
    """Tables on stdout, progress on stderr."""
    # Piped output (a log, CI) gets room for the tables instead of rich's 80 columns.
    return Console(width=None if sys.stdout.isatty() else width), Console(
        stderr=True, soft_wrap=True
    )
