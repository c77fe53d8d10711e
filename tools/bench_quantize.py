"""What on-device INT8 calibration buys in speed, and what the accuracy gate lets through.

For each model, in one run, on the CPU:

1. the sample sets, built once with `calibration/build_samples.py` (photos for
   person-ssdlite, pages of text for text-det-ppocr);
2. `edge-agent calibrate --json` on them, with a copy of `calibration/<model>.toml` whose
   `bench_seconds` is `--time` and whose `accuracy_iterations` is `--accuracy-iterations`;
   its report gives edge-agent's f32, device-default and winning-model throughput, the rung
   that won the gate, and its metric;
3. plain INT8, whatever the gate says: `Calibrator.compress("int8")` (NNCF with the recipe's
   ignored scope, the ladder's first rung) on the same samples, scored on the same held-out
   samples and saved as IR, so the table always has an INT8 figure;
4. OpenVINO's `benchmark_app -hint throughput -t --time` on the FP32 IR (at
   `-infer_precision f32`, and at the device default), on the gate's winner and on plain INT8:
   the limit edge-agent is compared with; `edge-agent bench` on the plain INT8 IR; and, for
   ONNX models, `edge-agent bench --backend onnxruntime` on FP32 as the second engine.
   These run `--rounds` times in the opposite order every other round.

It prints, per model, every figure beside the gate metric, and the ratios: INT8 / f32 (held to
>= 1.8x on a CPU with VNNI: AVX-512 VNNI, AVX-VNNI or AMX; shown without a verdict, "n/a on
this CPU", elsewhere), INT8 / device default, and whether the winner's metric drop is within
the recipe's max_drop. A ratio whose rounds disagree by more than 15% is flagged noisy; the
edge-agent f32, default and winner figures are one reading each, taken inside `calibrate`. The
CPU's VNNI, AMX and BF16 flags, the OpenVINO and NNCF versions and the load average before and
after are printed too.

NNCF's accuracy control (text-det-ppocr's plain INT8 fails the gate, so its ladder reaches it)
re-ranks about a hundred layer groups per iteration, one compile each: minutes per iteration
on a 2-core box. `--accuracy-iterations` therefore defaults to 1 (the recipes' own default is
5), which can leave that rung short of the gate. The default run takes 10 to 20 minutes.

Run it from the checkout, with the models already fetched:

    EDGE_AGENT_CACHE=/tmp/eacache python tools/bench_quantize.py
    python tools/bench_quantize.py --models person-ssdlite --time 15 --json out.json

Exit status: 0 when every figure was measured and every target met, 1 when a target was
missed, 2 when a measurement failed.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import openvino as ov
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench_runtime import (  # noqa: E402
    NOISY_SPREAD,
    MeasureError,
    Measurement,
    ModelUnderTest,
    Run,
    benchmark_app,
    cpu_name,
    describe,
    edge_agent_bench,
    load_average,
    one_line,
)

BIN = Path(sys.executable).parent
DEFAULT_MODELS = ("person-ssdlite", "text-det-ppocr")
# The sample set each model calibrates on (build_samples.py's folders); images otherwise.
DATA = {"text-det-ppocr": "text"}
TARGET_INT8_OVER_F32 = 1.8
# CPU flags any of which gives the INT8 dot-product instructions the target assumes.
VNNI_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")
SHOWN_FLAGS = (
    "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16"
)  # fmt: skip
BF16_FLAGS = ("avx512_bf16", "amx_bf16")
# Rungs that quantize activations too: the ones the INT8 speed target is about.
FULL_INT8_RUNGS = {"int8", "int8-scope", "int8-accuracy"}
RECIPE_OVERRIDES = ("bench_seconds", "accuracy_iterations")

BAPP_F32 = "benchmark_app f32"
BAPP_DEFAULT = "benchmark_app default"
BAPP_WINNER = "benchmark_app winner"
BAPP_INT8 = "benchmark_app INT8 plain"
EA_INT8 = "edge-agent INT8 plain"
EA_ORT = "edge-agent ORT f32"
KINDS = (BAPP_F32, BAPP_DEFAULT, BAPP_WINNER, BAPP_INT8, EA_INT8, EA_ORT)


@dataclass(frozen=True, slots=True)
class PlainInt8:
    """The ungated INT8 model and the FP32 IR it came from, as files."""

    fp32_ir: Path
    int8_ir: Path
    metric: str
    metric_after: float
    max_drop: float
    seconds: float

    @property
    def drop(self) -> float:
        return 1.0 - self.metric_after


@dataclass(slots=True)
class ModelResult:
    """Everything measured on one model."""

    name: str
    report: dict[str, Any] | None = None
    calibrate_error: str | None = None
    calibrate_seconds: float | None = None
    plain: PlainInt8 | None = None
    plain_error: str | None = None
    measurements: dict[str, Measurement] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return (
            self.calibrate_error is not None
            or self.plain_error is not None
            or any(m.error is not None for m in self.measurements.values())
        )


@dataclass(frozen=True, slots=True)
class Ratio:
    """A derived figure on edge-agent and on benchmark_app, with a target if it has one."""

    name: str
    ours: float | None
    limit: float | None = None
    target: float | None = None
    applies: bool = True
    """False: the target is shown, not judged (the CPU lacks what it assumes)."""
    at_most: bool = False
    unit: str = "x"
    noisy: bool = False

    @property
    def passed(self) -> bool | None:
        if self.ours is None or self.target is None or not self.applies:
            return None
        return self.ours <= self.target if self.at_most else self.ours >= self.target

    def text(self, value: float | None) -> str:
        if value is None:
            return "—"
        return f"{value:.2f}x" if self.unit == "x" else f"{value:.4f}"


def cpu_flags() -> dict[str, bool]:
    """Which of the flags INT8 and BF16 speed depends on this CPU reports."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    found = re.search(r"^flags\s*:\s*(.*)$", text, re.MULTILINE)
    flags = set(found.group(1).split()) if found else set()
    return {name: name in flags for name in (*SHOWN_FLAGS, *VNNI_FLAGS, *BF16_FLAGS)}


def _quiet_home(root: Path) -> str:
    """A HOME whose OpenVINO telemetry consent file says no, for benchmark_app."""
    home = root / "home"
    (home / "intel").mkdir(parents=True)
    (home / "intel" / "openvino_telemetry").write_text("0\n")
    return str(home)


def build_samples(out: Path) -> None:
    """calibration/build_samples.py --out OUT, once for every model."""
    argv = [sys.executable, str(REPO / "calibration" / "build_samples.py"), "--out", str(out)]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        detail = one_line(done.stderr or done.stdout)
        raise MeasureError(f"build_samples.py exited {done.returncode}: {detail}")


def recipe_copy(name: str, seconds: float, iterations: int, folder: Path) -> Path:
    """calibration/<name>.toml with bench_seconds and accuracy_iterations set on top.

    The two keys go first, before any [table], and replace the recipe's own top-level ones.
    """
    source = REPO / "calibration" / f"{name}.toml"
    kept: list[str] = []
    in_table = False
    for line in source.read_text().splitlines() if source.is_file() else []:
        in_table = in_table or re.match(r"\s*\[", line) is not None
        key = line.split("=", 1)[0].strip()
        if not in_table and "=" in line and key in RECIPE_OVERRIDES:
            continue
        kept.append(line)
    head = [
        f"# tools/bench_quantize.py: a copy of {source.name} with its timing set",
        f"bench_seconds = {float(seconds)!r}",
        f"accuracy_iterations = {iterations}",
    ]
    path = folder / f"{name}.toml"
    path.write_text("\n".join(head + kept) + "\n")
    return path


def run_calibrate(
    name: str, data: Path, recipe: Path, out: Path, say: Callable[[str], None]
) -> dict[str, Any]:
    """`edge-agent calibrate --json`; its stages are relayed as they start, its report parsed."""
    argv = [str(BIN / "edge-agent"), "calibrate", "--model", name, "--data", str(data)]
    argv += ["--recipe", str(recipe), "--out", str(out), "--json"]
    tail: collections.deque[str] = collections.deque(maxlen=20)
    with tempfile.TemporaryFile("w+") as stdout:
        try:
            proc = subprocess.Popen(argv, stdout=stdout, stderr=subprocess.PIPE, text=True)
        except OSError as exc:
            raise MeasureError(f"cannot run {argv[0]}: {exc.strerror}") from None
        for raw in proc.stderr or ():
            line = raw.strip()
            if line.startswith("calibrate "):
                say(f"    {line}")
            if line:
                tail.append(line)
        code = proc.wait()
        stdout.seek(0)
        text = stdout.read()
    if code != 0:
        detail = one_line("\n".join(tail))
        raise MeasureError(f"edge-agent calibrate exited {code}: {detail}")
    try:
        report: dict[str, Any] = json.loads(text.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        report = {}
    wanted = ("mode", "metric", "metric_after", "max_drop", "throughput_before",
              "throughput_default", "throughput_after", "default_precision")  # fmt: skip
    if not isinstance(report, dict) or any(key not in report for key in wanted):
        raise MeasureError(f"edge-agent calibrate printed no report: {one_line(text)}")
    return report


@contextlib.contextmanager
def _quiet_nncf() -> Iterator[None]:
    # NNCF also draws progress bars on stdout; keep stdout for the tables.
    from edge_agent.quantize.calibrate import quiet_nncf

    with quiet_nncf(), contextlib.redirect_stdout(sys.stderr):
        yield


def quantize_plain(name: str, data: Path, recipe_path: Path, folder: Path) -> PlainInt8:
    """The ladder's first rung, ungated: NNCF INT8 with the recipe's ignored scope, as IR.

    Also writes the FP32 IR (at the manifest's input shape) it came from, and a manifest
    beside each, so `edge-agent bench --model FILE.xml` can run them.
    """
    # NNCF is slow to import and only this step needs it.
    from edge_agent.catalog.catalog import Catalog, default_models_dir
    from edge_agent.cli.main import default_cache_dir
    from edge_agent.quantize.api import to_toml
    from edge_agent.quantize.calibrate import CalibrationData, Calibrator, save_ir
    from edge_agent.quantize.data import load_frames
    from edge_agent.quantize.recipe import load_recipe

    started = time.perf_counter()
    try:
        recipe = load_recipe(recipe_path)
        resolved = Catalog(default_models_dir(), default_cache_dir()).resolve(name)
        frames = load_frames(data, recipe.max_samples)
        with _quiet_nncf():
            calibrator = Calibrator(resolved, CalibrationData(frames, []), recipe, "CPU")
            model = calibrator.compress("int8")
            score = calibrator.evaluate(model)
        fp32_ir = save_ir(calibrator.fp32, folder / "fp32")
        int8_ir = save_ir(model, folder / "int8")
    except Exception as exc:  # NNCF, OpenVINO and edge-agent each raise their own kinds
        raise MeasureError(f"plain INT8: {one_line(str(exc)) or type(exc).__name__}") from None
    manifest = resolved.manifest.model_copy(
        update={"format": "ir", "source": None, "quantization": None}
    )
    sidecar = to_toml(manifest.model_dump(mode="json", exclude_none=True))
    for ir in (fp32_ir, int8_ir):
        ir.with_suffix(".toml").write_text(sidecar)
    return PlainInt8(
        fp32_ir=fp32_ir,
        int8_ir=int8_ir,
        metric=calibrator.task.metric,
        metric_after=score,
        max_drop=recipe.max_drop,
        seconds=time.perf_counter() - started,
    )


def _as_file(model: ModelUnderTest, path: Path) -> ModelUnderTest:
    """The same model and input, from an IR file (its name is its path, for edge-agent)."""
    return ModelUnderTest(
        name=str(path),
        path=path,
        format="ir",
        input_name=model.input_name,
        shape=model.shape,
        shape_overridden=False,
    )


def measure(
    model: ModelUnderTest,
    result: ModelResult,
    seconds: int,
    rounds: int,
    home: str,
    say: Callable[[str], None],
) -> None:
    """benchmark_app on every variant and edge-agent on the rest, alternating round by round."""
    ms = result.measurements = {kind: Measurement(kind) for kind in KINDS}
    plain, report = result.plain, result.report
    winner = report.get("path") if report is not None else None
    if report is None:
        ms[BAPP_WINNER].skipped = "calibrate failed"
    elif winner is None:
        ms[BAPP_WINNER].skipped = "no rung passed the gate: FP32 kept, the f32 rows apply"
    if plain is None:
        for kind in (BAPP_F32, BAPP_DEFAULT, BAPP_INT8, EA_INT8):
            ms[kind].skipped = "plain INT8 quantization failed"
    if model.format != "onnx":
        ms[EA_ORT].skipped = f"ONNX Runtime cannot read a {model.format} model"

    steps: dict[str, Callable[[], Run]] = {}
    if plain is not None:
        fp32, int8 = _as_file(model, plain.fp32_ir), _as_file(model, plain.int8_ir)
        steps[BAPP_F32] = lambda: benchmark_app(fp32, seconds, "f32", home)
        steps[BAPP_DEFAULT] = lambda: benchmark_app(fp32, seconds, None, home)
        steps[BAPP_INT8] = lambda: benchmark_app(int8, seconds, None, home)
        steps[EA_INT8] = lambda: edge_agent_bench(int8, "openvino", seconds, None)
    if winner is not None:
        won = _as_file(model, Path(winner))
        steps[BAPP_WINNER] = lambda: benchmark_app(won, seconds, None, home)
    steps[EA_ORT] = lambda: edge_agent_bench(model, "onnxruntime", seconds, None)

    for index in range(rounds):
        order = KINDS if index % 2 == 0 else tuple(reversed(KINDS))
        for kind in order:
            m = ms[kind]
            if m.skipped is not None or m.error is not None:
                continue
            say(f"  round {index + 1}/{rounds}: {kind}")
            try:
                m.runs.append(steps[kind]())
            except MeasureError as exc:
                m.error = str(exc)
                say(f"[red]error:[/] {model.name}: {kind}: {exc}")


def _over(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def ratios(result: ModelResult, vnni: bool) -> list[Ratio]:
    """INT8 over f32 and over the default, the gate's verdict, and the engines compared."""
    report, plain, ms = result.report or {}, result.plain, result.measurements

    def fps(kind: str) -> float | None:
        return ms[kind].fps if kind in ms else None

    def noisy(*kinds: str) -> bool:
        return any(ms[k].spread > NOISY_SPREAD for k in kinds if k in ms)

    before = report.get("throughput_before")
    default = report.get("throughput_default")
    after = report.get("throughput_after")
    mode = report.get("mode", "?")
    default_precision = report.get("default_precision", "default")
    # The winner kept FP32: benchmark_app's winner is its f32 figure.
    won = BAPP_WINNER if report.get("path") else BAPP_F32
    found = [
        Ratio(
            "INT8 plain / f32",
            _over(fps(EA_INT8), before),
            _over(fps(BAPP_INT8), fps(BAPP_F32)),
            TARGET_INT8_OVER_F32,
            applies=vnni,
            noisy=noisy(EA_INT8, BAPP_INT8, BAPP_F32),
        ),
        Ratio(
            f"INT8 plain / default ({default_precision})",
            _over(fps(EA_INT8), default),
            _over(fps(BAPP_INT8), fps(BAPP_DEFAULT)),
            noisy=noisy(EA_INT8, BAPP_INT8, BAPP_DEFAULT),
        ),
        Ratio(
            f"INT8 gated winner ({mode}) / f32",
            _over(after, before),
            _over(fps(won), fps(BAPP_F32)),
            TARGET_INT8_OVER_F32 if mode in FULL_INT8_RUNGS else None,
            applies=vnni,
            noisy=noisy(won, BAPP_F32),
        ),
        Ratio(
            f"INT8 gated winner ({mode}) / default ({default_precision})",
            _over(after, default),
            _over(fps(won), fps(BAPP_DEFAULT)),
            noisy=noisy(won, BAPP_DEFAULT),
        ),
    ]
    if report:
        max_drop = float(report["max_drop"])
        drop = float(report["metric_before"]) - float(report["metric_after"])
        found.append(
            Ratio(
                f"winner's {report['metric']} drop",
                drop,
                target=max_drop,
                at_most=True,
                unit="drop",
            )
        )
    if plain is not None:
        found.append(Ratio(f"plain INT8's {plain.metric} drop (ungated)", plain.drop, unit="drop"))
    found.append(
        Ratio(
            "edge-agent / benchmark_app, INT8 plain",
            _over(fps(EA_INT8), fps(BAPP_INT8)),
            noisy=noisy(EA_INT8, BAPP_INT8),
        )
    )
    if ms.get(EA_ORT) is not None and ms[EA_ORT].skipped is None:
        found.append(Ratio("edge-agent OV f32 / ORT f32", _over(before, fps(EA_ORT))))
        found.append(
            Ratio(
                "edge-agent OV INT8 plain / ORT f32",
                _over(fps(EA_INT8), fps(EA_ORT)),
                noisy=noisy(EA_INT8, EA_ORT),
            )
        )
    return found


def _fps(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"


def _rounds(m: Measurement | None) -> str:
    if m is None or m.fps is None:
        if m is not None and m.error is not None:
            return "[red]failed[/]"
        return "[dim]skipped[/]" if m is not None and m.skipped is not None else "—"
    return " / ".join(f"{r.iterations / r.seconds:.1f}" for r in m.runs)


def _precision(m: Measurement | None) -> str:
    if m is None or not m.runs:
        return "—"
    return "/".join(sorted({r.precision for r in m.runs}))


def render(
    model: ModelUnderTest, result: ModelResult, found: list[Ratio], flags: dict[str, bool]
) -> list[Table]:
    """The figures of each variant, then the ratios."""
    report, plain, ms = result.report or {}, result.plain, result.measurements
    shape = "x".join(str(d) for d in model.shape)
    default_precision = str(report.get("default_precision", "?"))
    metric = str(report.get("metric", plain.metric if plain else "?"))
    max_drop = float(report.get("max_drop", plain.max_drop if plain else 0.0))
    why = ""
    if default_precision == "f32" and not any(flags[f] for f in BF16_FLAGS):
        why = ": no bf16 here"
    notes = [
        f"{m.kind}: {m.skipped or m.error}"
        for m in ms.values()
        if m.skipped is not None or m.error is not None
    ]
    notes += [
        f"calibrate: {problem}" for problem in (result.calibrate_error,) if problem is not None
    ]
    notes += [f"plain INT8: {p}" for p in (result.plain_error,) if p is not None]
    if report.get("rungs"):
        tried = ", ".join(
            f"{r['rung']} {r['metric_after']:.4f} {'pass' if r['passed'] else 'fail'} "
            f"({r['seconds']:.0f} s)"
            for r in report["rungs"]
        )
        notes.append(f"ladder ({report.get('duration_s', 0.0):.0f} s in all): {tried}")
    notes.append(
        "edge-agent f32, default and winner: one reading each, inside `edge-agent calibrate`; "
        "edge-agent INT8 plain and benchmark_app: the mean of the rounds"
    )
    notes.append(
        f"gate metric: {metric}, against the FP32 model's answers on the held-out samples "
        f"(1.0 = identical); recipe max_drop {max_drop}"
    )
    figures = Table(
        title=f"{model.name} ({model.format}, {shape}) on CPU: calibration and throughput",
        caption="\n".join(notes),
        caption_justify="left",
    )
    columns = ("variant", "gate metric", "edge-agent FPS", "benchmark_app FPS",
               "precision hint", "benchmark_app per round")  # fmt: skip
    for column in columns:
        figures.add_column(column, justify="left" if column == "variant" else "right")

    def gate(value: float | None) -> str:
        if value is None:
            return "—"
        verdict = "[green]within[/]" if 1.0 - value <= max_drop + 1e-9 else "[red]exceeds[/]"
        return f"{value:.4f} {verdict}"

    mode = str(report.get("mode", "?"))
    winner_kind = BAPP_WINNER if report.get("path") else BAPP_F32
    rows: list[tuple[str, str, float | None, Measurement | None]] = [
        ("f32", "1.0000 ref", report.get("throughput_before"), ms.get(BAPP_F32)),
        (
            f"default precision ({default_precision}{why})",
            "1.0000 ref",
            report.get("throughput_default"),
            ms.get(BAPP_DEFAULT),
        ),
        (
            f"INT8 gated winner: {mode}",
            gate(report.get("metric_after")),
            report.get("throughput_after"),
            ms.get(winner_kind),
        ),
        (
            "INT8 plain (ungated)",
            gate(plain.metric_after if plain else None),
            ms[EA_INT8].fps if EA_INT8 in ms else None,
            ms.get(BAPP_INT8),
        ),
    ]
    for index, (label, score, ours, limit) in enumerate(rows):
        # The quantized rows run INT8 kernels; the hint is what everything else runs at.
        quantized = index == 3 or (index == 2 and mode in FULL_INT8_RUNGS)
        figures.add_row(
            label,
            score,
            _fps(ours),
            _fps(limit.fps if limit else None),
            _precision(limit) + (" + int8" if quantized and limit and limit.runs else ""),
            _rounds(limit),
        )
    if EA_ORT in ms and ms[EA_ORT].skipped is None:
        ort = ms[EA_ORT]
        figures.add_row("ONNX Runtime f32", "—", _fps(ort.fps), "—", _precision(ort), "—")

    table = Table(title=f"{model.name}: INT8 against f32 and the device default")
    for column in ("ratio", "edge-agent", "benchmark_app", "target", "result"):
        table.add_column(column, justify="left" if column == "ratio" else "right")
    for r in found:
        bound = "<= " if r.at_most else ">= "
        target = "—" if r.target is None else bound + r.text(r.target)
        if r.target is not None and not r.applies:
            verdict = "[dim]n/a on this CPU[/]"
        else:
            verdict = {True: "[green]pass[/]", False: "[red]FAIL[/]", None: "[dim]info[/]"}[
                r.passed
            ]
        if r.noisy:
            verdict += " [yellow](noisy)[/]"
        table.add_row(r.name, r.text(r.ours), r.text(r.limit), target, verdict)
    captions = [
        f"targets judge the edge-agent figure; INT8 / f32 >= {TARGET_INT8_OVER_F32}x assumes "
        f"VNNI ({', '.join(VNNI_FLAGS)}), and applies to rungs that quantize activations"
    ]
    if any(r.noisy for r in found):
        captions.append(
            f"noisy: rounds of a measurement differ by more than {NOISY_SPREAD - 1:.0%}; "
            "rerun on an idle machine"
        )
    table.caption = "\n".join(captions)
    table.caption_justify = "left"
    return [figures, table]


def bench_model(
    name: str,
    samples: Path,
    root: Path,
    args: argparse.Namespace,
    seconds: int,
    rounds: int,
    home: str,
    say: Callable[[str], None],
) -> tuple[ModelUnderTest, ModelResult]:
    """Calibrate, quantize plainly, then measure; raises MeasureError only if `name` is unusable."""
    model = describe(name, None)
    result = ModelResult(name)
    data = samples / DATA.get(name, "images")
    folder = root / name
    folder.mkdir()
    recipe = recipe_copy(name, float(seconds), args.accuracy_iterations, folder)
    say(f"  edge-agent calibrate ({data.name}, accuracy_iterations={args.accuracy_iterations})")
    started = time.perf_counter()
    try:
        result.report = run_calibrate(name, data, recipe, folder / "calibrated", say)
    except MeasureError as exc:
        result.calibrate_error = str(exc)
        say(f"[red]error:[/] {name}: {exc}")
    result.calibrate_seconds = time.perf_counter() - started
    say(f"  calibrate took {result.calibrate_seconds:.0f} s; plain INT8 (ungated)")
    try:
        result.plain = quantize_plain(name, data, recipe, folder / "plain")
    except MeasureError as exc:
        result.plain_error = str(exc)
        say(f"[red]error:[/] {name}: {exc}")
    measure(model, result, seconds, rounds, home, say)
    return model, result


def _to_json(result: ModelResult, found: list[Ratio]) -> dict[str, Any]:
    plain = result.plain
    return {
        "calibrate_report": result.report,
        "calibrate_error": result.calibrate_error,
        "calibrate_seconds": result.calibrate_seconds,
        "plain_int8": None
        if plain is None
        else {
            "metric": plain.metric,
            "metric_after": plain.metric_after,
            "drop": plain.drop,
            "max_drop": plain.max_drop,
            "seconds": plain.seconds,
        },
        "plain_int8_error": result.plain_error,
        "measurements": {
            m.kind: {
                "fps": m.fps,
                "p50_ms": m.p50_ms,
                "runs": [asdict(r) for r in m.runs],
                "spread": m.spread,
                "error": m.error,
                "skipped": m.skipped,
            }
            for m in result.measurements.values()
        },
        "ratios": [{**asdict(r), "passed": r.passed} for r in found],
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS), help="model names")
    parser.add_argument(
        "--time",
        type=float,
        default=8.0,
        help="seconds per throughput reading: calibrate's bench_seconds, benchmark_app -t, "
        "edge-agent bench --time (whole seconds)",
    )
    parser.add_argument("--rounds", type=int, default=2, help="rounds, order reversed each time")
    parser.add_argument(
        "--accuracy-iterations",
        type=int,
        default=1,
        help="cap on NNCF accuracy-control iterations (minutes each on 2 cores; default 1)",
    )
    parser.add_argument("--json", type=Path, default=None, help="write every figure here")
    args = parser.parse_args(argv)
    if args.accuracy_iterations < 1:
        parser.error("--accuracy-iterations must be 1 or more")
    rounds = max(1, args.rounds)
    # benchmark_app takes whole seconds; everyone gets the same.
    seconds = max(1, round(args.time))

    # Piped output (a log, CI) gets room for the tables instead of rich's 80 columns.
    console = Console(width=None if sys.stdout.isatty() else 120)
    status = Console(stderr=True, soft_wrap=True)
    import onnxruntime  # Only for its version: the measurement itself runs in edge-agent.

    nncf_version = importlib.metadata.version("nncf")
    flags = cpu_flags()
    vnni = any(flags[f] for f in VNNI_FLAGS)
    load_before = load_average()
    console.print(f"CPU: {cpu_name()} ({os.cpu_count()} logical)")
    console.print(
        "CPU flags: " + ", ".join(f"{f} {'yes' if flags[f] else 'no'}" for f in SHOWN_FLAGS)
    )
    console.print(
        f"INT8 / f32 >= {TARGET_INT8_OVER_F32}x target: "
        + ("judged (VNNI present)" if vnni else "n/a on this CPU (no VNNI); figures still shown")
    )
    console.print(
        f"OpenVINO {ov.get_version()}, NNCF {nncf_version}, ONNX Runtime {onnxruntime.__version__}"
    )
    console.print(f"load average before: {load_before}")
    console.print(
        f"{seconds} s per throughput reading; {rounds} round(s) of benchmark_app and edge-agent "
        f"bench; NNCF accuracy control capped at {args.accuracy_iterations} iteration(s) "
        "(--accuracy-iterations: each one re-ranks ~100 layer groups, one compile each, "
        "minutes on 2 cores)"
    )
    report: dict[str, Any] = {
        "cpu": cpu_name(),
        "logical_cpus": os.cpu_count(),
        "cpu_flags": flags,
        "vnni": vnni,
        "openvino": ov.get_version(),
        "nncf": nncf_version,
        "onnxruntime": onnxruntime.__version__,
        "seconds_per_run": seconds,
        "rounds": rounds,
        "accuracy_iterations": args.accuracy_iterations,
        "models": {},
    }
    status_code = 0
    with tempfile.TemporaryDirectory(prefix="bench-quantize-") as tmp:
        root = Path(tmp)
        samples = root / "samples"
        status.print(f"building sample sets in {samples}")
        try:
            build_samples(samples)
        except MeasureError as exc:
            status.print(f"[red]error:[/] {exc}")
            return 2
        home = _quiet_home(root)
        for name in args.models:
            status.print(f"[bold]{name}[/]")
            try:
                model, result = bench_model(
                    name, samples, root, args, seconds, rounds, home, status.print
                )
            except MeasureError as exc:
                status.print(f"[red]error:[/] {name}: {exc}")
                status_code = 2
                continue
            found = ratios(result, vnni)
            for table in render(model, result, found, flags):
                console.print(table)
            if result.failed:
                status_code = 2
            elif any(r.passed is False for r in found) and status_code == 0:
                status_code = 1
            report["models"][name] = _to_json(result, found)
    load_after = load_average()
    console.print(f"load average after: {load_after}")
    report["load_average"] = {"before": load_before, "after": load_after}
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        console.print(f"wrote {args.json}")
    return status_code


if __name__ == "__main__":
    sys.exit(main())
