"""Where a pipeline's CPU goes, thread by thread: the engine's, the reader's, the Python around.

On a 2-core box the question behind "why is the pipeline slower than benchmark_app?" is
which thread takes the cores the engine would otherwise have. This runs one
person-ssdlite pipeline (throughput hint, no sinks) in this process over the walk video
of edge_agent/clips.py (640x480 MJPG), lets it warm up, and then reads every thread's
CPU time from /proc/self/task over `--seconds`. Python threads are named by the pipeline
(`read-*`: decode, fit and submit; `emit-*`: heads, events, sinks; `infer-*`/`infer_*`:
the model's workers); threads Python does not know are the engine's own (OpenVINO's
stream threads) or a library's. It prints each one's share of a core and its CPU
milliseconds per frame, beside the pipeline's FPS, the CPU flags and the load average.
Compare the engine's ms per frame with `benchmark_app`'s (cores / FPS) to see whether
inference itself got slower or the host took the cores.

    EDGE_AGENT_CACHE=.cache/edge-agent python tools/pipeline_threads.py --seconds 6
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import openvino as ov
from benchlib import consoles, load_average, print_machine
from rich.table import Table

from edge_agent.catalog.catalog import Catalog, default_models_dir
from edge_agent.clips import write_walk
from edge_agent.paths import Layout
from edge_agent.pipelines.runner import PipelineHandle
from edge_agent.pipelines.spec import PipelineSpec
from edge_agent.runtime.pool import ModelPool
from edge_agent.telemetry.stats import PipelineStats

WARM_UP_S = 3.0
ENGINE = "engine and libraries"
"""Threads Python did not start: OpenVINO's stream threads, FFmpeg's, OpenCV's."""


def _cpu_by_thread() -> dict[int, tuple[str, float]]:
    """Native thread id -> (name, CPU seconds) for every thread of this process."""
    python = {t.native_id: t.name for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    found: dict[int, tuple[str, float]] = {}
    for entry in Path("/proc/self/task").iterdir():
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # the thread ended meanwhile
            continue
        fields = stat.rsplit(")", 1)[1].split()
        tid = int(entry.name)
        name = python.get(tid) or ENGINE
        found[tid] = (name, (int(fields[11]) + int(fields[12])) / tick)
    return found


def _group(name: str) -> str:
    # One row per role: pipeline threads carry the pipeline's id, workers a number.
    for role in ("read", "emit", "infer"):
        if name.startswith(role):
            return role
    return name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=6.0, help="how long to sample")
    parser.add_argument("--model", default="person-ssdlite")
    args = parser.parse_args(argv)
    console, status = consoles(100)
    print_machine(console, {"OpenVINO": ov.get_version()})
    with tempfile.TemporaryDirectory(prefix="pipeline-threads-") as tmp:
        layout = Layout.from_env(os.environ, state=Path(tmp) / "state")
        pool = ModelPool(Catalog(default_models_dir(), layout.cache))
        video = Path(tmp) / "walk.avi"
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
        handle = PipelineHandle(spec, pool, [], layout=layout)
        summary: list[PipelineStats] = []
        runner = threading.Thread(target=lambda: summary.append(handle.run()), name="runner")
        runner.start()
        time.sleep(WARM_UP_S)
        first = handle.telemetry.snapshot().frames
        before, started = _cpu_by_thread(), time.perf_counter()
        time.sleep(args.seconds)
        after, elapsed = _cpu_by_thread(), time.perf_counter() - started
        done = handle.telemetry.snapshot().frames - first
        handle.stop()
        runner.join()
        handle.close()
    error = handle.pipeline.error
    if not summary or error is not None or not done:
        status.print(f"error: the pipeline did not run: {error or 'no frames'}")
        return 2
    fps = done / elapsed
    cores: dict[str, float] = {}
    for tid, (name, cpu) in after.items():
        role = _group(name)
        cores[role] = cores.get(role, 0.0) + (cpu - before.get(tid, (name, 0.0))[1]) / elapsed
    table = Table(title=f"{args.model} pipeline, {fps:.1f} FPS over {elapsed:.1f} s")
    table.add_column("thread")
    table.add_column("cores", justify="right")
    table.add_column("CPU ms per frame", justify="right")
    for name, share in sorted(cores.items(), key=lambda kv: -kv[1]):
        if share >= 0.005:
            table.add_row(name, f"{share:.3f}", f"{share / fps * 1e3:.2f}" if fps else "-")
    total = sum(cores.values())
    table.add_row("all", f"{total:.3f}", f"{total / fps * 1e3:.2f}" if fps else "-")
    console.print(table)
    console.print(f"load average after: {load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
