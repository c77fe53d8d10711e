"""The capacity benchmarks of issue 11, short: tools/bench_runtime.py, bench_pipeline.py,
bench_capacity.py and pipeline_threads.py, each run once as its own process with its smoke
arguments, and its JSON (or table) checked for what the tool promises, so a refactor that
breaks one fails here rather than on the next run by hand. Nothing is timed: the CI box is a
loaded 2-core machine, so figures are checked for being measured and for agreeing with each
other, never for their speed. The full runs are the tools without arguments."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from edge_agent.catalog.catalog import ResolvedModel
from tests.agent_kit import publish_reference

TOOLS = Path(__file__).resolve().parents[2] / "tools"
Report = dict[str, Any]

# bench_capacity's question, from its docstring: 640x480 cameras at 15 FPS, and a stream fits
# when none drops a frame and its p95 end-to-end latency is under 100 ms.
STREAM_FPS = 15.0
P95_LIMIT_MS = 100.0


def run_tool(
    script: str, args: list[str], allowed: tuple[int, ...], cache_dir: Path, tmp_path: Path
) -> tuple[subprocess.CompletedProcess[str], Report]:
    """Run a benchmark script with `--json`; its process and its report.

    Args:
        allowed: the exit statuses that mean every figure was measured.
    """
    out = tmp_path / f"{Path(script).stem}.json"
    # Forced colour would put escape codes between the printed figures compared below.
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE")}
    env |= {"EDGE_AGENT_CACHE": str(cache_dir), "EDGE_AGENT_STATE_DIR": str(tmp_path / "state")}
    proc = subprocess.run(
        [sys.executable, str(TOOLS / script), *args, "--json", str(out)],
        capture_output=True, text=True, timeout=300, check=False, env=env,
    )  # fmt: skip
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode in allowed, proc.stderr[-3000:]
    report: Report = json.loads(out.read_text())
    return proc, report


def assert_measured(figure: Report) -> None:
    """Taken, not skipped or failed: a positive rate each run, with the load it ran under."""
    assert figure["error"] is None, figure
    assert figure["skipped"] is None, figure
    assert figure["runs"], figure
    assert all(run["fps"] > 0 for run in figure["runs"]), figure
    assert all(run["load"] >= 0 for run in figure["runs"]), figure


def precisions(figure: Report) -> set[str]:
    """What a figure ran at: its runs say, or the measurement does for runs that cannot."""
    found = {run["precision"] for run in figure["runs"]} | {figure["precision"]}
    return found - {None}


def assert_ratio_of(ratios: dict[str, Report], figures: dict[str, Report], a: str, b: str) -> None:
    """The ratio "a / b" is a's FPS over b's: one round, so the median of the round-by-round
    ratios is the ratio of the figures."""
    ratio = ratios[f"{a} / {b}"]
    assert ratio["unit"] == "x"
    assert ratio["value"] == pytest.approx(figures[a]["fps"] / figures[b]["fps"])


def assert_verdicts(ratios: list[Report], returncode: int) -> None:
    """Each verdict follows from its value and target, and the exit status from the verdicts:
    1 when a target was missed, else 0."""
    for r in ratios:
        if r["target"] is None or not r["applies"] or r["value"] is None:
            assert r["passed"] is None, r
        elif r["at_least"]:
            assert r["passed"] == (r["value"] >= r["target"]), r
        else:
            assert r["passed"] == (r["value"] <= r["target"]), r
    assert returncode == (1 if any(r["passed"] is False for r in ratios) else 0)


def assert_machine_beside_figures(stdout: str, report: Report) -> None:
    """The CPU flags and the load average, printed as the report has them, the flags both in
    the header and again beside the figures."""
    flags: dict[str, bool] = report["cpu_flags"]
    assert flags
    assert all(isinstance(on, bool) for on in flags.values())
    have = " ".join(name for name, on in flags.items() if on) or "none of these"
    lack = " ".join(name for name, on in flags.items() if not on)
    line = f"CPU flags: {have}" + (f"; lacks {lack}" if lack else "")
    assert line in stdout.splitlines()
    # A caption may wrap the line; it is the same words.
    assert " ".join(stdout.split()).count(line) >= 2
    for when in ("before", "after"):
        loads = report["load_average"][when]
        assert len([float(x) for x in loads.split()]) == 3
        assert f"load average {when}: {loads}" in stdout


READY = "engine loop, ready input"
FRESH = "engine loop, fresh input"


@pytest.mark.parametrize("hint", ["throughput", "latency"])
def test_bench_runtime_measures_edge_agent_against_each_reference(
    resolve: Callable[[str], ResolvedModel], cache_dir: Path, tmp_path: Path, hint: str
) -> None:
    resolve("vad-silero")
    proc, report = run_tool(
        "bench_runtime.py",
        ["--models", "vad-silero", "--time", "1", "--rounds", "1", "--compare", "openvino",
         "--hint", hint],
        (0, 1), cache_dir, tmp_path,
    )  # fmt: skip
    assert report["rounds"] == 1
    assert report["hint"] == hint
    model = report["models"]["vad-silero"]
    assert model["format"] == "onnx"
    figures: dict[str, Report] = model["measurements"]
    measured = ["edge-agent OV", "benchmark_app", "edge-agent ORT", "naive loop"]
    # benchmark_app's one-request loop in Python, on edge-agent's graph, splits the latency
    # gap; under the throughput hint there is no one-request loop to compare.
    loops = [READY, FRESH]
    if hint == "latency":
        measured += loops
    else:
        for name in loops:
            assert figures[name]["skipped"]
            assert figures[name]["runs"] == []
    for name in measured:
        assert_measured(figures[name])
        assert precisions(figures[name]), name
    # The tool's own word: ONNX Runtime runs f32 whatever the device default.
    assert precisions(figures["edge-agent ORT"]) == {"f32"}
    # An audio model has no frame preprocessing to fold; the tool says so instead of a figure.
    folded = figures["benchmark_app, folded"]
    assert folded["skipped"]
    assert folded["runs"] == []
    assert all(figure["error"] is None for figure in figures.values())

    ratios = {r["name"]: r for r in model["ratios"]}
    for reference in ("benchmark_app", "edge-agent ORT", "naive loop"):
        assert_ratio_of(ratios, figures, "edge-agent OV", reference)
    if hint == "latency":
        # With nothing folded, the Python call is measured against benchmark_app itself.
        assert_ratio_of(ratios, figures, READY, "benchmark_app")
        assert_ratio_of(ratios, figures, FRESH, READY)
        assert_ratio_of(ratios, figures, "edge-agent OV", FRESH)
    else:
        assert not [name for name in ratios if "engine loop" in name]
    assert ratios["edge-agent OV / benchmark_app"]["target"] is not None
    assert_verdicts(model["ratios"], proc.returncode)
    assert_machine_beside_figures(proc.stdout, report)


PIPE_ON = "pipeline OV throughput"
PIPE_OFF = "pipeline OV throughput --no-telemetry"
PIPE_RAW = "pipeline OV throughput, raw video"
PIPE_LAT = "pipeline OV latency"
BAPP = "benchmark_app throughput"
TEXT_OV = "text-orientation pipeline OV"
TEXT_ORT = "text-orientation pipeline ORT"
DECODE = "decode only (cv2)"
NAIVE = "naive loop"


def test_bench_pipeline_measures_the_pipeline_against_each_reference(
    resolve: Callable[[str], ResolvedModel], cache_dir: Path, tmp_path: Path
) -> None:
    resolve("person-ssdlite")
    resolve("text-orientation")
    # The shortest run that still measures every row: most of its time is process start-up.
    proc, report = run_tool(
        "bench_pipeline.py",
        ["--frames", "30", "--time", "1", "--rounds", "1"],
        (0, 1), cache_dir, tmp_path,
    )  # fmt: skip
    assert report["rounds"] == 1
    frames = report["frames"]
    figures: dict[str, Report] = report["figures"]
    # The tool's docstring lists these rows, steps 1 to 7.
    with_model = (PIPE_ON, PIPE_OFF, PIPE_RAW, PIPE_LAT, BAPP, "benchmark_app latency", NAIVE,
                  TEXT_OV, TEXT_ORT)  # fmt: skip
    for name in (DECODE, *with_model):
        assert_measured(figures[name])
    for name in with_model:
        assert precisions(figures[name]), name
        assert "unknown" not in precisions(figures[name]), name
    # person-ssdlite is a TF graph ONNX Runtime cannot read: skipped, with the reason.
    assert figures["pipeline ORT"]["skipped"]
    assert figures["pipeline ORT"]["runs"] == []
    assert all(figure["error"] is None for figure in figures.values())
    # With telemetry on, a pipeline's stages cover every frame of the video.
    for name in (PIPE_ON, PIPE_RAW, PIPE_LAT, TEXT_OV, TEXT_ORT):
        (run,) = figures[name]["runs"]
        assert run["stages"]["end_to_end"]["count"] == frames, name

    ratios = {r["name"]: r for r in report["ratios"]}
    for a, b in ((PIPE_ON, BAPP), (PIPE_ON, NAIVE), (DECODE, PIPE_ON), (PIPE_RAW, BAPP),
                 (PIPE_ON, PIPE_RAW), (TEXT_OV, TEXT_ORT)):  # fmt: skip
        assert_ratio_of(ratios, figures, a, b)
    on, off = figures[PIPE_ON]["fps"], figures[PIPE_OFF]["fps"]
    cost = ratios["telemetry cost (FPS off - on) / off"]
    assert cost["unit"] == "%"
    assert cost["value"] == pytest.approx((off - on) / off * 100)
    (latency,) = figures[PIPE_LAT]["runs"]
    p95 = ratios["p95 end-to-end latency, latency hint"]
    assert p95["value"] == pytest.approx(latency["p95_ms"])
    # Busy shares, in %, of a stage's mean ms at the pipeline's FPS.
    (busy,) = figures[PIPE_ON]["runs"]
    stages = busy["stages"]
    reader_ms = stages["read"]["mean_ms"] + stages.get("preprocess", {"mean_ms": 0.0})["mean_ms"]
    reader = ratios["reader thread busy: (read + preprocess) x FPS"]
    assert reader["value"] == pytest.approx(reader_ms * busy["fps"] / 10)
    prefix = "infer requests busy: infer x FPS / "
    (engine,) = (r for name, r in ratios.items() if name.startswith(prefix))
    requests = int(engine["name"].removeprefix(prefix))
    assert requests >= 1
    infer_ms = stages["infer"]["mean_ms"]
    assert engine["value"] == pytest.approx(infer_ms * busy["fps"] / requests / 10)

    # The targets the docstring holds the pipeline to are judged, not only shown.
    for name in (f"{PIPE_ON} / {BAPP}", f"{PIPE_ON} / {NAIVE}"):
        assert ratios[name]["target"] is not None, name
    assert cost["target"] is not None
    assert cost["at_least"] is False
    assert_verdicts(report["ratios"], proc.returncode)
    assert_machine_beside_figures(proc.stdout, report)


def test_bench_capacity_searches_the_streams_that_fit_and_states_the_limit(
    resolve: Callable[[str], ResolvedModel], cache_dir: Path, tmp_path: Path
) -> None:
    resolve("person-ssdlite")
    # A model file with its manifest beside it, as `edge-agent calibrate` writes one: the
    # streams, the separate processes and benchmark_app must all run that file.
    model, _ = publish_reference(tmp_path / "mine", "person-ssdlite")
    max_n = 2
    # Separate processes are kept: they are what a user tries first.
    args = ["--seconds", "2", "--max-n", str(max_n), "--model", str(model)]
    proc, report = run_tool("bench_capacity.py", args, (0,), cache_dir, tmp_path)
    assert report["model"] == str(model)
    assert report["quantization"] is None  # the reference manifest: not calibrated
    # Out of step by default, as separate cameras are; --in-step is the burst worst case.
    assert report["spread"] is True
    assert report["precision"]
    trials: list[Report] = report["trials"]
    for t in trials:
        assert t["streams"] >= 1, t
        assert t["fps"] > 0, t
        assert t["played"] > 0, t
        assert t["dropped"] >= 0, t
        assert t["p95_ms"] > 0, t
        assert t["load"] >= 0, t
        assert t["fits"] == (t["dropped"] == 0 and t["p95_ms"] < P95_LIMIT_MS), t
    one = [t for t in trials if t["mode"] == "one process"]
    apart = [t for t in trials if t["mode"] == "separate processes"]
    assert len(one) + len(apart) == len(trials)
    assert one
    assert all(t["streams"] <= max_n for t in one)
    best = report["streams"]
    assert best == max((t["streams"] for t in one if t["fits"]), default=0)
    # Separate processes run at the N one process fitted, or not at all when none did.
    assert [t["streams"] for t in apart] == ([best] if best else [])
    # The printed table is the report's trials.
    rows = [
        [cell.strip() for cell in line.strip().strip("│").split("│")]
        for line in proc.stdout.splitlines()
        if line.startswith("│")
    ]
    assert [(r[0], int(r[1]), r[2]) for r in rows] == [
        (t["mode"], t["streams"], "yes" if t["fits"] else "no") for t in trials
    ]

    before, after = report["benchmark_app_fps_before"], report["benchmark_app_fps_after"]
    assert before > 0
    assert after > 0
    assert report["benchmark_app_fps"] == pytest.approx((before + after) / 2)
    limit = report["theoretical_streams"]
    assert limit == pytest.approx(report["benchmark_app_fps"] / STREAM_FPS)
    printed = " ".join(proc.stdout.split())
    assert f"/ {STREAM_FPS:g} = {limit:.1f} streams" in printed
    assert f"one process fits {best} = {best / limit:.2f}x of it" in printed
    assert f"{model}, 640x480" in printed
    assert_machine_beside_figures(proc.stdout, report)


def test_pipeline_threads_splits_many_streams_cpu_and_wakes_by_thread(
    resolve: Callable[[str], ResolvedModel], cache_dir: Path, tmp_path: Path
) -> None:
    resolve("person-ssdlite")
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE")}
    env |= {"EDGE_AGENT_CACHE": str(cache_dir), "EDGE_AGENT_STATE_DIR": str(tmp_path / "state")}
    args = ["--streams", "2", "--seconds", "2", "--no-benchmark-app"]
    proc = subprocess.run(
        [sys.executable, str(TOOLS / "pipeline_threads.py"), *args],
        capture_output=True, text=True, timeout=300, check=False, env=env,
    )  # fmt: skip
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode == 0, proc.stderr[-3000:]
    title = next(line for line in proc.stdout.splitlines() if "realtime streams" in line)
    fps = float(title.split("streams, ")[1].split(" FPS")[0])
    # Two cameras at 15 FPS, which any box that runs the suite keeps up with.
    assert 2 * STREAM_FPS * 0.8 <= fps <= 2 * STREAM_FPS * 1.2, title
    rows = {
        cells[0]: [float(c) for c in cells[1:]]
        for line in proc.stdout.splitlines()
        if line.startswith("│")
        for cells in [[c.strip() for c in line.strip().strip("│").split("│")]]
    }
    assert {"engine and libraries", "read", "emit", "play", "infer", "all"} <= set(rows), rows
    for role in ("read", "emit", "play"):
        # cores, CPU ms, woken and preempted per frame: each frame wakes these at least once
        # (its player at its due time, its reader with it, its emitter with the result).
        # CPU time comes in 10 ms clock ticks, so only the reader's decode is sure to show.
        assert min(rows[role]) >= 0, (role, rows[role])
        assert rows[role][2] >= 0.5, (role, rows[role])
    assert rows["read"][1] > 0, rows
    assert rows["all"][1] >= sum(rows[r][1] for r in ("read", "emit", "play", "infer")), rows
    assert "CPU flags:" in proc.stdout
    assert "load average after:" in proc.stdout


def test_bench_outbox_fills_the_quota_and_times_puts_at_it() -> None:
    proc = subprocess.run(
        [sys.executable, str(TOOLS / "bench_outbox.py"), "--quota-mb", "1", "--puts", "50"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    # The quota bounds the file, log and indexes included; the messages take most of it.
    found = re.search(r"filled to ([\d.]+) of 1 MB on disk: ([\d.]+) MB of messages", proc.stdout)
    assert found, proc.stdout
    disk, messages = float(found[1]), float(found[2])
    assert 0.9 <= disk <= 1.0, proc.stdout
    assert 0.4 <= messages < disk, proc.stdout
    medians = re.findall(r"median ([0-9.]+) ms, p95 ([0-9.]+) ms \(50 puts\)", proc.stdout)
    assert len(medians) == 2, proc.stdout
    assert all(0 < float(m) <= float(p) for m, p in medians), medians
    assert "CPU flags:" in proc.stdout
    assert "load average after:" in proc.stdout
