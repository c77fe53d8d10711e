"""Where a pipeline's CPU goes, thread by thread: the engine's, the reader's, the Python around.

On a 2-core box the question behind "why is the pipeline slower than benchmark_app?" is
which thread takes the cores the engine would otherwise have. This runs one
person-ssdlite pipeline (throughput hint, no sinks) in this process over the walk video
of edge_agent/clips.py (640x480 MJPG), lets it warm up, and then reads every thread's
CPU time from /proc/self/task over `--seconds`. Python threads are named by the pipeline
(`read-*`: decode, fit and submit; `emit-*`: heads, events, sinks; `infer-*`/`infer_*`:
the model's workers); threads Python does not know are the engine's own (OpenVINO's
stream threads) or a library's. It prints each one's share of a core, its CPU
milliseconds per frame and how often it slept and was woken (voluntary context switches)
or was preempted (involuntary ones) per frame, beside the pipeline's FPS, the CPU flags
and the load average. A Python thread's wake takes a core from an engine thread in the
middle of an inference; the engine's own involuntary switches count what that cost it.

`--streams N` runs N cameras instead, as tools/bench_capacity.py does: N pipelines in one
process on one shared model, each playing the 640x480 15 FPS clip in realtime, out of step
(`play-*` threads are their players, `pipeline-*` their callers). The figures are then
per frame of all streams together.

Then the budget. `benchmark_app` runs the same model fed the clip's frames twice, a short
run and a long one, each timed by its CPU time (this process's children's rusage): the
difference between the two is the engine's CPU per frame with the start-up (reading and
compiling the model) taken out, and its share of the cores says how busy `benchmark_app`
keeps them. With the engine at that cost, a pipeline whose work outside the engine takes
X ms of CPU a frame can reach at most cores / (engine + X) frames a second; the table
prints that ceiling against `benchmark_app`, and the X a pipeline may spend for 0.9x of it
(bench_pipeline's target), and the bound no pipeline decoding JPEG on the CPU passes:
the cores over the engine's cost plus the decode's alone. Compare the engine's ms per frame
in the pipeline with `benchmark_app`'s to see whether inference itself got slower or the
host took the cores.
About 40 seconds; `--no-benchmark-app` skips the budget:

    EDGE_AGENT_CACHE=.cache/edge-agent python tools/pipeline_threads.py --seconds 6
    EDGE_AGENT_CACHE=.cache/edge-agent python tools/pipeline_threads.py --streams 16 --seconds 20
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import numpy.typing as npt
import openvino as ov
from bench_capacity import FPS, stream_spec, write_clip
from benchlib import (
    MeasureError,
    benchmark_app,
    consoles,
    describe,
    load_average,
    print_machine,
    quiet_home,
)
from pipeline_refs import write_frames
from rich.table import Table

from edge_agent.catalog.catalog import Catalog, default_models_dir
from edge_agent.clips import write_walk
from edge_agent.paths import Layout
from edge_agent.pipelines.multi import PipelineGroup
from edge_agent.pipelines.runner import PipelineHandle
from edge_agent.pipelines.sources import RealtimeFileSource
from edge_agent.pipelines.spec import ModelRef, PipelineSpec
from edge_agent.runtime.pool import ModelPool

WARM_UP_S = 3.0
SHORT_S = 2
"""The short benchmark_app run: mostly start-up, taken out of the long one."""
TARGET = 0.9
"""tools/bench_pipeline.py's target: the pipeline at this share of benchmark_app."""
ENGINE = "engine and libraries"
"""Threads Python did not start: OpenVINO's stream threads, FFmpeg's, OpenCV's."""


@dataclass(frozen=True, slots=True)
class Use:
    """One thread's counters so far."""

    name: str
    cpu_s: float
    woken: int
    """Voluntary context switches: it slept (a wait, a lock, the GIL) and was woken."""
    preempted: int
    """Involuntary ones: it was running and the scheduler gave its core to another."""

    def minus(self, before: Use | None) -> Use:
        if before is None:
            return self
        return Use(
            self.name,
            self.cpu_s - before.cpu_s,
            self.woken - before.woken,
            self.preempted - before.preempted,
        )


def _total(name: str, uses: list[Use]) -> Use:
    """`uses` added up, under `name`."""
    return Use(
        name,
        sum(u.cpu_s for u in uses),
        sum(u.woken for u in uses),
        sum(u.preempted for u in uses),
    )


def _switches(status: str, key: str) -> int:
    return int(status.split(f"\n{key}:", 1)[1].split()[0])


def _use_by_thread() -> dict[int, Use]:
    """Native thread id -> its counters, for every thread of this process."""
    python = {t.native_id: t.name for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    found: dict[int, Use] = {}
    for entry in Path("/proc/self/task").iterdir():
        try:
            stat = (entry / "stat").read_text()
            status = (entry / "status").read_text()
        except OSError:  # the thread ended meanwhile
            continue
        fields = stat.rsplit(")", 1)[1].split()
        tid = int(entry.name)
        found[tid] = Use(
            python.get(tid) or ENGINE,
            (int(fields[11]) + int(fields[12])) / tick,
            _switches(status, "voluntary_ctxt_switches"),
            _switches(status, "nonvoluntary_ctxt_switches"),
        )
    return found


def _group(name: str) -> str:
    # One row per role: pipeline threads carry the pipeline's id, workers a number.
    for role in ("read", "emit", "infer", "play", "pipeline"):
        if name.startswith(role):
            return role
    return name


def _group_of(streams: int, clip: Path, pool: ModelPool, model: str) -> PipelineGroup:
    """`streams` realtime cameras on `clip`, out of step, as bench_capacity plays them."""
    ref = ModelRef(name=model)
    specs = [stream_spec(i, clip).model_copy(update={"model": ref}) for i in range(streams)]
    group = PipelineGroup(specs, pool)
    for i, handle in enumerate(group.handles):
        source = handle.pipeline.source
        if isinstance(source, RealtimeFileSource):
            source.phase = i / streams / FPS
    return group


@dataclass(frozen=True, slots=True)
class EngineCost:
    """What benchmark_app's engine costs a frame, with its start-up taken out."""

    fps: float
    cpu_ms: float
    """CPU milliseconds per frame: (long run's CPU - short run's) / (its frames - short's)."""


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def engine_cost(model: str, video: Path, root: Path, seconds: int) -> EngineCost:
    """benchmark_app on `model` fed frames of `video`, `SHORT_S` then `SHORT_S + seconds`.

    Raises:
        MeasureError: benchmark_app failed or did not say how many frames it ran.
    """
    under_test = describe(model)
    frames = root / "frames"
    frames.mkdir()
    write_frames(video, frames)
    home = quiet_home(root)
    cpu, runs = [], []
    for length in (SHORT_S, SHORT_S + seconds):
        before = _children_cpu_s()
        runs.append(benchmark_app(under_test, length, None, home, inputs=frames))
        cpu.append(_children_cpu_s() - before)
    short, long = runs
    if short.iterations is None or long.iterations is None or long.iterations <= short.iterations:
        raise MeasureError("benchmark_app did not say how many frames it ran")
    per_frame = (cpu[1] - cpu[0]) / (long.iterations - short.iterations)
    return EngineCost(fps=long.fps, cpu_ms=per_frame * 1e3)


def decode_cost(video: Path, seconds: float = 1.5) -> float:
    """CPU milliseconds to decode one of `video`'s JPEG packets as the reader does.

    The reader calls cv2.imdecode on the packets of an MJPG file at full size when no
    reduction applies (a 640x480 frame for a 300x300 model), one thread, so this times
    exactly that: every packet in turn, by this thread's CPU clock, for about `seconds`.

    Timed in this process, after the clip was written and the pipeline ran, as the reader
    decodes in a process that compiled a model first. That history matters: glibc serves
    a 900 KB frame with an mmap of its own until it has seen a block that large freed, so a
    fresh process that only decodes faults every frame's pages in anew (1.42 against 0.93
    ms a frame, 418 against 2 page faults, 2-core KVM Xeon, OpenCV 5.0). The pipeline's
    process has seen such frees (the compile makes them): `edge-agent run-pipeline` over
    2,400 frames took 14-25 faults a frame, and pinning glibc's thresholds with mallopt
    changed neither its CPU per frame nor 16 streams' (8.0-8.4 ms either way), so the
    product leaves the allocator alone.

    Raises:
        MeasureError: the video has no JPEG packets to decode.
    """
    cap = cv2.VideoCapture(str(video))
    packets: list[npt.NDArray[np.uint8]] = []
    try:
        if cap.set(cv2.CAP_PROP_FORMAT, -1):
            while len(packets) < 200:
                ok, packet = cap.read()
                if not ok:
                    break
                packets.append(np.asarray(packet, np.uint8).ravel())
    finally:
        cap.release()
    if not packets or cv2.imdecode(packets[0], cv2.IMREAD_COLOR) is None:
        raise MeasureError(f"{video.name} gave no JPEG packets to decode")
    decoded, started = 0, time.thread_time()
    while time.thread_time() - started < seconds:
        for packet in packets:
            cv2.imdecode(packet, cv2.IMREAD_COLOR)
        decoded += len(packets)
    return (time.thread_time() - started) / decoded * 1e3


def budget_table(
    cost: EngineCost, engine_ms: float, outside_ms: float, fps: float, decode_ms: float
) -> Table:
    """benchmark_app's cost, and what it leaves the pipeline on this many cores."""
    cores = len(os.sched_getaffinity(0))
    ceiling = cores / ((cost.cpu_ms + outside_ms) / 1e3)
    # Decoding on the CPU is the one outside cost no code around it can remove: with it
    # alone outside the engine, this is as fast as any pipeline on these cores can go.
    bound = cores / ((cost.cpu_ms + decode_ms) / 1e3)
    allowed = cores / (TARGET * cost.fps) * 1e3 - cost.cpu_ms
    table = Table(title=f"the budget on {cores} cores")
    table.add_column("figure")
    table.add_column("value", justify="right")
    rows = (
        ("benchmark_app FPS (fed the clip's frames)", f"{cost.fps:.1f}"),
        ("benchmark_app engine CPU ms per frame", f"{cost.cpu_ms:.2f}"),
        ("benchmark_app cores busy", f"{cost.cpu_ms * cost.fps / 1e3:.2f} of {cores}"),
        ("pipeline engine CPU ms per frame", f"{engine_ms:.2f}"),
        ("pipeline CPU ms per frame outside the engine", f"{outside_ms:.2f}"),
        ("pipeline / benchmark_app, measured", f"{fps / cost.fps:.2f}x"),
        (
            "ceiling at this outside cost: cores / (engine + outside)",
            f"{ceiling:.1f} FPS, {ceiling / cost.fps:.2f}x",
        ),
        (f"outside cost allowed for {TARGET}x", f"{allowed:.2f} ms"),
        ("JPEG decode alone (cv2.imdecode, one thread) ms per frame", f"{decode_ms:.2f}"),
        (
            "bound with decode the only outside cost: cores / (engine + decode)",
            f"{bound:.1f} FPS, {bound / cost.fps:.2f}x",
        ),
    )
    for row in rows:
        table.add_row(*row)
    return table


def _row(use: Use, elapsed: float, frames: int) -> list[str]:
    return [
        use.name,
        f"{use.cpu_s / elapsed:.3f}",
        f"{use.cpu_s / frames * 1e3:.2f}",
        f"{use.woken / frames:.2f}",
        f"{use.preempted / frames:.2f}",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=6.0, help="how long to sample")
    parser.add_argument("--model", default="person-ssdlite")
    parser.add_argument(
        "--streams",
        type=int,
        default=0,
        help="run this many realtime 15 FPS cameras in one process instead of one file "
        "pipeline at full speed",
    )
    parser.add_argument(
        "--no-benchmark-app",
        dest="budget",
        action="store_false",
        help="skip benchmark_app and the budget table",
    )
    args = parser.parse_args(argv)
    console, status = consoles(100)
    print_machine(console, {"OpenVINO": ov.get_version()})
    with tempfile.TemporaryDirectory(prefix="pipeline-threads-") as tmp:
        layout = Layout.from_env(os.environ, state=Path(tmp) / "state")
        pool = ModelPool(Catalog(default_models_dir(), layout.cache))
        video = Path(tmp) / "walk.avi"
        if args.streams > 0:
            write_clip(video)  # looped by the sources
            group = _group_of(args.streams, video, pool, args.model)
            handles = group.handles
            run: Callable[[], object] = group.run
        else:
            frames = round((WARM_UP_S + args.seconds) * 400) + 600  # never runs out at 400 FPS
            write_walk(video, frames=frames)
            spec = PipelineSpec.model_validate(
                {
                    "id": "cam",
                    "model": {"name": args.model, "hint": "throughput"},
                    "source": {"type": "file", "path": str(video)},
                    "sinks": [],
                }
            )
            handles = [PipelineHandle(spec, pool, [], layout=layout)]
            run = handles[0].run
        summary: list[object] = []
        runner = threading.Thread(target=lambda: summary.append(run()), name="runner")
        runner.start()
        time.sleep(WARM_UP_S)
        first = sum(h.telemetry.snapshot().frames for h in handles)
        before, started = _use_by_thread(), time.perf_counter()
        time.sleep(args.seconds)
        after, elapsed = _use_by_thread(), time.perf_counter() - started
        done = sum(h.telemetry.snapshot().frames for h in handles) - first
        dropped = sum(h.telemetry.snapshot().dropped for h in handles)
        for h in handles:
            h.stop()
        runner.join()
        for h in handles:
            h.close()
        cost: EngineCost | None = None
        decode_ms = 0.0
        if args.budget and done:
            try:
                cost = engine_cost(args.model, video, Path(tmp), round(args.seconds))
                decode_ms = decode_cost(video)
            except MeasureError as exc:
                status.print(f"error: benchmark_app: {exc}")
                return 2
    error = next((h.pipeline.error for h in handles if h.pipeline.error is not None), None)
    if not summary or error is not None or not done:
        status.print(f"error: the pipeline did not run: {error or 'no frames'}")
        return 2
    fps = done / elapsed
    by_role: dict[str, list[Use]] = {}
    for tid, now in after.items():
        used = now.minus(before.get(tid))
        by_role.setdefault(_group(used.name), []).append(used)
    roles = {role: _total(role, uses) for role, uses in by_role.items()}
    total = _total("all", list(roles.values()))
    what = f"{args.streams} realtime streams" if args.streams else "pipeline"
    extra = f", {dropped} dropped since the start" if args.streams else ""
    table = Table(title=f"{args.model} {what}, {fps:.1f} FPS over {elapsed:.1f} s{extra}")
    for column in ("thread", "cores", "CPU ms per frame", "woken per frame", "preempted per frame"):
        table.add_column(column, justify="left" if column == "thread" else "right")
    for use in sorted(roles.values(), key=lambda u: -u.cpu_s):
        if use.cpu_s / elapsed >= 0.005 or use.woken >= done / 10:
            table.add_row(*_row(use, elapsed, done))
    table.add_row(*_row(total, elapsed, done))
    console.print(table)
    if cost is not None:
        engine = roles[ENGINE].cpu_s / done * 1e3 if ENGINE in roles else 0.0
        outside = total.cpu_s / done * 1e3 - engine
        console.print(budget_table(cost, engine, outside, fps, decode_ms))
    console.print(f"load average after: {load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
