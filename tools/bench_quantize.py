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
CPU's VNNI, AMX and BF16 flags, the OpenVINO and NNCF versions, and the load average beside
every figure are printed too. The quantization steps live in tools/quantize_steps.py.

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
import importlib.metadata
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import openvino as ov
from benchlib import (
    BF16_FLAGS,
    VNNI_FLAGS,
    MeasureError,
    Measurement,
    ModelUnderTest,
    Ratio,
    consoles,
    cpu_flags,
    finish,
    flags_text,
    load_text,
    noisy,
    print_machine,
    quiet_home,
    ratio_of,
    ratio_table,
)
from quantize_steps import (
    BAPP_DEFAULT,
    BAPP_F32,
    BAPP_INT8,
    BAPP_WINNER,
    EA_INT8,
    EA_ORT,
    FULL_INT8_RUNGS,
    ModelResult,
    bench_model,
    build_samples,
    to_json,
)
from rich.table import Table

DEFAULT_MODELS = ("person-ssdlite", "text-det-ppocr")
TARGET_INT8_OVER_F32 = 1.8


def _over(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def ratios(result: ModelResult, vnni: bool) -> list[Ratio]:
    """INT8 over f32 and over the default, the gate's verdict, and the engines compared."""
    report, plain, ms = result.report or {}, result.plain, result.measurements

    def fps(kind: str) -> float | None:
        return ms[kind].fps if kind in ms else None

    def shaky(*kinds: str) -> bool:
        return noisy(*(ms[k] for k in kinds if k in ms))

    before = report.get("throughput_before")
    default = report.get("throughput_default")
    after = report.get("throughput_after")
    mode = report.get("mode", "?")
    default_precision = report.get("default_precision", "default")
    # The winner kept FP32: benchmark_app's winner is its f32 figure.
    won = BAPP_WINNER if report.get("path") else BAPP_F32
    full = mode in FULL_INT8_RUNGS
    found = [
        Ratio(
            "INT8 plain / f32",
            _over(fps(EA_INT8), before),
            TARGET_INT8_OVER_F32,
            applies=vnni,
            noisy=shaky(EA_INT8, BAPP_INT8, BAPP_F32),
            reference=ratio_of(ms[BAPP_INT8], ms[BAPP_F32]),
        ),
        Ratio(
            f"INT8 plain / default ({default_precision})",
            _over(fps(EA_INT8), default),
            noisy=shaky(EA_INT8, BAPP_INT8, BAPP_DEFAULT),
            reference=ratio_of(ms[BAPP_INT8], ms[BAPP_DEFAULT]),
        ),
        Ratio(
            f"INT8 gated winner ({mode}) / f32",
            _over(after, before),
            TARGET_INT8_OVER_F32 if full else None,
            applies=vnni,
            noisy=shaky(won, BAPP_F32),
            reference=ratio_of(ms[won], ms[BAPP_F32]),
        ),
        Ratio(
            f"INT8 gated winner ({mode}) / default ({default_precision})",
            _over(after, default),
            noisy=shaky(won, BAPP_DEFAULT),
            reference=ratio_of(ms[won], ms[BAPP_DEFAULT]),
        ),
    ]
    if report:
        drop = float(report["metric_before"]) - float(report["metric_after"])
        found.append(
            Ratio(
                f"winner's {report['metric']} drop",
                drop,
                float(report["max_drop"]),
                at_least=False,
                unit="",
            )
        )
    if plain is not None:
        found.append(Ratio(f"plain INT8's {plain.metric} drop (ungated)", plain.drop, unit=""))
    found.append(
        Ratio(
            "edge-agent / benchmark_app, INT8 plain",
            ratio_of(ms[EA_INT8], ms[BAPP_INT8]),
            noisy=shaky(EA_INT8, BAPP_INT8),
        )
    )
    if ms[EA_ORT].skipped is None:
        found.append(Ratio("edge-agent OV f32 / ORT f32", _over(before, fps(EA_ORT))))
        found.append(
            Ratio(
                "edge-agent OV INT8 plain / ORT f32",
                ratio_of(ms[EA_INT8], ms[EA_ORT]),
                noisy=shaky(EA_INT8, EA_ORT),
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
    return " / ".join(f"{r.fps:.1f}" for r in m.runs)


def _precision(m: Measurement | None) -> str:
    if m is None or not m.runs:
        return "—"
    return "/".join(sorted({r.precision or "?" for r in m.runs}))


def _notes(result: ModelResult, metric: str, max_drop: float) -> list[str]:
    report, ms = result.report or {}, result.measurements
    notes = [f"{m.name}: {m.skipped or m.error}" for m in ms.values() if m.skipped or m.error]
    notes += [f"calibrate: {p}" for p in (result.calibrate_error,) if p is not None]
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
        "edge-agent INT8 plain and benchmark_app: the median of the rounds"
    )
    notes.append(
        f"gate metric: {metric}, against the FP32 model's answers on the held-out samples "
        f"(1.0 = identical); recipe max_drop {max_drop}"
    )
    notes.append(flags_text(cpu_flags()))
    notes.append(
        "load: 1-minute load average at the end of calibrate (edge-agent) and of "
        "each benchmark_app round"
    )
    return notes


def render(model: ModelUnderTest, result: ModelResult, flags: dict[str, bool]) -> Table:
    """The figures of each variant, with the gate metric and the load beside each."""
    report, plain, ms = result.report or {}, result.plain, result.measurements
    default_precision = str(report.get("default_precision", "?"))
    metric = str(report.get("metric", plain.metric if plain else "?"))
    max_drop = float(report.get("max_drop", plain.max_drop if plain else 0.0))
    why = (
        ": no bf16 here"
        if default_precision == "f32" and not any(flags.get(f) for f in BF16_FLAGS)
        else ""
    )
    shape = "x".join(str(d) for d in model.shape)
    figures = Table(
        title=f"{model.name} ({model.format}, {shape}) on CPU: calibration and throughput",
        caption="\n".join(_notes(result, metric, max_drop)),
        caption_justify="left",
    )
    columns = (
        "variant",
        "gate metric",
        "edge-agent FPS",
        "benchmark_app FPS",
        "precision hint",
        "load",
        "benchmark_app per round",
    )
    for column in columns:
        figures.add_column(column, justify="left" if column == "variant" else "right")

    def gate(value: float | None) -> str:
        if value is None:
            return "—"
        verdict = "[green]within[/]" if 1.0 - value <= max_drop + 1e-9 else "[red]exceeds[/]"
        return f"{value:.4f} {verdict}"

    mode = str(report.get("mode", "?"))
    winner_kind = BAPP_WINNER if report.get("path") else BAPP_F32
    inside = "—" if result.calibrate_load is None else f"{result.calibrate_load:.2f}"
    rows: list[tuple[str, str, float | None, Measurement | None, bool]] = [
        ("f32", "1.0000 ref", report.get("throughput_before"), ms.get(BAPP_F32), False),
        (
            f"default precision ({default_precision}{why})",
            "1.0000 ref",
            report.get("throughput_default"),
            ms.get(BAPP_DEFAULT),
            False,
        ),
        (
            f"INT8 gated winner: {mode}",
            gate(report.get("metric_after")),
            report.get("throughput_after"),
            ms.get(winner_kind),
            mode in FULL_INT8_RUNGS,
        ),
        (
            "INT8 plain (ungated)",
            gate(plain.metric_after if plain else None),
            ms[EA_INT8].fps,
            ms.get(BAPP_INT8),
            True,
        ),
    ]
    for label, score, ours, limit, quantized in rows:
        # The quantized rows run INT8 kernels; the hint is what everything else runs at.
        hint = _precision(limit) + (" + int8" if quantized and limit and limit.runs else "")
        load = load_text(limit) if limit else "—"
        if label != "INT8 plain (ungated)":
            load = f"{inside} / {load}"
        figures.add_row(
            label, score, _fps(ours), _fps(limit.fps if limit else None), hint, load, _rounds(limit)
        )
    if ms[EA_ORT].skipped is None:
        ort = ms[EA_ORT]
        figures.add_row(
            "ONNX Runtime f32", "—", _fps(ort.fps), "—", _precision(ort), load_text(ort), "—"
        )
    return figures


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

    console, status = consoles(130)
    import onnxruntime

    versions = {
        "OpenVINO": ov.get_version(),
        "NNCF": importlib.metadata.version("nncf"),
        "ONNX Runtime": onnxruntime.__version__,
    }
    report = print_machine(console, versions)
    flags = report["cpu_flags"]
    vnni = any(flags[f] for f in VNNI_FLAGS)
    console.print(
        f"INT8 / f32 >= {TARGET_INT8_OVER_F32}x target: "
        + ("judged (VNNI present)" if vnni else "n/a on this CPU (no VNNI); figures still shown")
    )
    console.print(
        f"{seconds} s per throughput reading; {rounds} round(s) of benchmark_app and edge-agent "
        f"bench; NNCF accuracy control capped at {args.accuracy_iterations} iteration(s) "
        "(--accuracy-iterations: each one re-ranks ~100 layer groups, one compile each, "
        "minutes on 2 cores)"
    )
    report.update(
        vnni=vnni,
        seconds_per_run=seconds,
        rounds=rounds,
        accuracy_iterations=args.accuracy_iterations,
        models={},
    )
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
        home = quiet_home(root)
        for name in args.models:
            status.print(f"[bold]{name}[/]")
            try:
                model, result = bench_model(
                    name,
                    samples,
                    root,
                    args.accuracy_iterations,
                    seconds,
                    rounds,
                    home,
                    status.print,
                )
            except MeasureError as exc:
                status.print(f"[red]error:[/] {name}: {exc}")
                status_code = 2
                continue
            found = ratios(result, vnni)
            console.print(render(model, result, flags))
            captions = [
                f"targets judge the edge-agent figure; INT8 / f32 >= {TARGET_INT8_OVER_F32}x "
                f"assumes VNNI ({', '.join(VNNI_FLAGS)}), and applies to rungs that quantize "
                "activations; benchmark_app: the same ratio on its figures"
            ]
            title = f"{model.name}: INT8 against f32 and the device default"
            console.print(ratio_table(title, found, "benchmark_app", captions))
            if result.failed:
                status_code = 2
            elif any(r.passed is False for r in found) and status_code == 0:
                status_code = 1
            report["models"][name] = to_json(result, found)
    finish(console, report, args.json)
    return status_code


if __name__ == "__main__":
    sys.exit(main())
