"""Soak: two pipelines on one pooled model, a hot swap every minute, a sink that fails.

What a box does for months, compressed: two camera pipelines share one compiled
person-ssdlite (a generated walk-through video, looped and paced like a camera),
both swap model every `--swap-every` seconds (between the throughput- and the
latency-hinted compile, so each swap compiles, and the old model must be closed
once its last frame is out), and each has a sink that raises on every 50th event.
At the end both are stopped at once.

It passes when:
- resident memory does not grow more than 10% after the warm-up. The two models alternate,
  so memory swings with a period of two swaps (which compile is live, what the allocator
  kept from the last one): a run with two whole periods after the warm-up compares the peak
  of the first period with the peak of the last, which one sample against one sample cannot
  do without landing on a trough or a crest; a shorter run compares the sample after the
  warm-up with the last. Each sample is split into anonymous (heap) and file-backed
  (mapped libraries and models) pages, so a rise can be told apart;
- no thread is left over once the pipelines are closed;
- stop() returns within 2 s;
- every swap happened, and every sink failure was counted, none fatal.

    EDGE_AGENT_CACHE=.cache/edge-agent python tools/soak.py --duration 1800

tests/integration/test_soak.py runs the same `soak()` for 40 s, swapping every 6 s (beside
tools/soak_agent.py's short run).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from edge_agent.catalog.catalog import Catalog, default_models_dir
from edge_agent.clips import write_walk
from edge_agent.logs import setup_logging
from edge_agent.paths import Layout
from edge_agent.pipelines.base import Frame, FrameResult
from edge_agent.pipelines.events import EventRule
from edge_agent.pipelines.runner import PipelineHandle
from edge_agent.pipelines.sinks import CallbackSink
from edge_agent.pipelines.sources import FileSourceSpec, open_source
from edge_agent.pipelines.spec import ModelRef, PipelineSpec
from edge_agent.pipelines.stopping import STOP_BUDGET_S
from edge_agent.procstats import status_bytes
from edge_agent.runtime.pool import ModelPool
from edge_agent.telemetry.stats import PipelineStats

MODELS = (
    ModelRef(name="person-ssdlite", hint="throughput"),
    ModelRef(name="person-ssdlite", hint="latency"),
)
RSS_TOLERANCE = 0.10
RULE = EventRule(name="person", label="person", appear_frames=1, gone_after_s=0.2)


class SoakReport(BaseModel):
    """What a soak run measured, and whether it held."""

    model_config = ConfigDict(extra="forbid")

    duration_s: float = Field(description="Seconds the pipelines ran before stop().")
    frames: dict[str, int] = Field(description="Frames each pipeline finished.")
    swaps: int = Field(description="Hot swaps requested per pipeline.")
    swap_errors: list[str] = Field(description="Swaps that failed, with their error.")
    events: int = Field(description="Events the failing sinks saw, over both pipelines.")
    sink_failures: int = Field(description="Sink failures the pipelines counted.")
    raised: int = Field(description="Times the failing sinks raised.")
    frame_failures: int = Field(description="Frames with no result.")
    dropped_on_stop: int = Field(description="Frames in flight dropped by the stop.")
    rss_start_mb: float = Field(description="Resident memory after the warm-up, MB.")
    rss_end_mb: float = Field(description="Resident memory at the end of the run, MB.")
    rss_samples_mb: list[float] = Field(description="Resident memory every few seconds, MB.")
    rss_anon_samples_mb: list[float] = Field(description="Its anonymous part (heap), MB.")
    rss_file_samples_mb: list[float] = Field(description="Its file-backed part, MB.")
    sample_every_s: float = Field(description="Seconds between two samples.")
    rss_growth: float = Field(description="Growth after the warm-up, as a fraction.")
    rss_judged_by: str = Field(description="'period peaks' or 'start and end' (a short run).")
    threads_before: int = Field(description="Python threads before the pipelines were built.")
    threads_after: int = Field(description="Python threads once they were stopped and closed.")
    leaked_threads: list[str] = Field(description="Threads left over, by name.")
    stop_s: float = Field(description="Seconds from stop() until both run() calls returned.")
    problems: list[str] = Field(description="Every way the run fell short; empty when it held.")

    @property
    def passed(self) -> bool:
        return not self.problems


SAMPLE_EVERY_S = 5.0


def memory_mb() -> tuple[float, float, float]:
    """This process's resident set size, and its anonymous and file-backed parts, in MB
    (/proc/self/status, Linux)."""
    found = status_bytes()
    if "VmRSS" not in found:
        raise RuntimeError("no VmRSS in /proc/self/status")
    mb = 2**20
    return found["VmRSS"] / mb, found.get("RssAnon", 0) / mb, found.get("RssFile", 0) / mb


def rss_mb() -> float:
    """This process's resident set size, MB."""
    return memory_mb()[0]


def rss_growth(samples: list[float], warm_index: int, period: int) -> tuple[float, str]:
    """Growth after sample `warm_index`: peak of the last whole `period` of samples against
    the peak of the first, when there are two; else the last sample against the warm one."""
    after = samples[warm_index:]
    if period >= 1 and len(after) >= 2 * period:
        first, last = max(after[:period]), max(after[-period:])
        return last / first - 1, "period peaks"
    return samples[-1] / samples[warm_index] - 1, "start and end"


class LoopingSource:
    """A video file played over and over at `fps`, as a camera would deliver it.

    Frame numbers and timestamps keep counting across loops, so event rules see one
    continuous stream.
    """

    def __init__(self, path: Path, fps: float) -> None:
        self._spec = FileSourceSpec(path=path)
        self._inner = open_source(self._spec)
        self._period = 1.0 / fps
        self._index = 0
        self._next = time.monotonic()

    def read(self) -> Frame | None:
        frame = self._inner.read()
        if frame is None:
            self._inner.close()
            self._inner = open_source(self._spec)
            frame = self._inner.read()
            if frame is None:
                return None
        delay = self._next - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        self._next = max(self._next + self._period, time.monotonic() - self._period)
        looped = Frame(self._index, self._index * self._period, frame.image, frame.read_s)
        self._index += 1
        return looped

    @property
    def dropped(self) -> int:
        return 0

    def close(self) -> None:
        self._inner.close()


class FailingSink:
    """Raises on every `every`-th event it sees; counts events and raises."""

    def __init__(self, every: int) -> None:
        self.every = every
        self.events = 0
        self.raised = 0

    def __call__(self, result: FrameResult) -> None:
        before = self.events
        self.events += len(result.events)
        if self.events // self.every > before // self.every:
            self.raised += 1
            raise RuntimeError(f"soak: failing on event {self.events // self.every * self.every}")


def soak(
    pool: ModelPool,
    video: Path,
    layout: Layout,
    duration_s: float,
    swap_every_s: float = 60.0,
    warmup_s: float | None = None,
    fps: float = 15.0,
    fail_every: int = 50,
    say: Callable[[str], None] = print,
) -> SoakReport:
    """Run the soak and measure it; see the module docstring for what passes.

    Args:
        pool: Where the two pipelines get their shared model.
        video: A clip to loop (a person walking in and out gives events).
        layout: The state and cache folders for the pipelines.
        duration_s: How long the pipelines run before they are stopped.
        swap_every_s: Seconds between hot swaps.
        warmup_s: When the starting RSS is taken; default two and a half swaps in,
            when each compiled model has been built, closed and built again.
        fps: Pace of each looping source.
        fail_every: The failing sink raises on every this-many events.
        say: Where progress lines go.
    """
    # Each of the first two swaps compiles a model the allocator has not yet held, and
    # memory rises once per model; from then on it should stay flat.
    warmup = min(warmup_s if warmup_s is not None else 2.5 * swap_every_s, duration_s / 2)
    threads_before = {t.ident for t in threading.enumerate()}
    failing = {name: FailingSink(fail_every) for name in ("cam-a", "cam-b")}
    handles = {
        name: PipelineHandle(
            PipelineSpec(
                id=name, model=MODELS[0], source=FileSourceSpec(path=video), events=[RULE], sinks=[]
            ),
            pool,
            [CallbackSink(sink)],
            layout=layout,
            frames=LoopingSource(video, fps),
        )
        for name, sink in failing.items()
    }
    results: dict[str, PipelineStats] = {}
    runners = [
        threading.Thread(target=lambda n=n, h=h: results.__setitem__(n, h.run()), name=f"soak-{n}")
        for n, h in handles.items()
    ]
    swap_errors: list[str] = []
    samples: list[float] = []
    anon: list[float] = []
    files: list[float] = []
    rss_start = 0.0
    warm_index = 0
    swaps = 0
    start = time.monotonic()
    for runner in runners:
        runner.start()
    next_swap = start + swap_every_s
    next_sample = start
    while (now := time.monotonic()) < start + duration_s:
        if now >= next_sample:
            rss, rss_anon, rss_file = memory_mb()
            samples.append(rss)
            anon.append(rss_anon)
            files.append(rss_file)
            next_sample += SAMPLE_EVERY_S
            if not rss_start and now - start >= warmup:
                rss_start, warm_index = samples[-1], len(samples) - 1
                say(f"warm: rss {rss_start:.0f} MB (anon {rss_anon:.0f}, file {rss_file:.0f})")
        if now >= next_swap:
            swaps += 1
            ref = MODELS[swaps % len(MODELS)]
            say(f"{now - start:6.0f} s: swap to {ref.name} ({ref.hint}); rss {rss_mb():.0f} MB")
            for handle in handles.values():
                handle.swap_model(ref, on_error=lambda e: swap_errors.append(str(e)))
            next_swap += swap_every_s
        time.sleep(min(0.5, max(0.0, min(next_sample, next_swap) - time.monotonic())))
    rss_end, rss_anon, rss_file = memory_mb()
    samples.append(rss_end)
    anon.append(rss_anon)
    files.append(rss_file)
    stop_at = time.monotonic()
    for handle in handles.values():
        handle.stop()
    for runner in runners:
        runner.join(timeout=30)
    stop_s = time.monotonic() - stop_at
    for handle in handles.values():
        handle.close()
    leaked = _leftover_threads(threads_before)
    stats = list(results.values())
    problems = []
    if len(stats) != len(handles):
        problems.append("a pipeline's run() never returned")
    # The models alternate, so memory's period is two swaps, in samples.
    period = round(2 * swap_every_s / SAMPLE_EVERY_S)
    growth, judged_by = rss_growth(samples, warm_index, period) if rss_start else (0.0, "")
    if growth > RSS_TOLERANCE:
        problems.append(f"RSS grew {growth:.0%} after the warm-up ({judged_by})")
    if leaked:
        problems.append(f"threads left over: {', '.join(leaked)}")
    if stop_s > STOP_BUDGET_S:
        problems.append(f"stop took {stop_s:.2f} s")
    if swap_errors:
        problems.append(f"{len(swap_errors)} swap(s) failed")
    raised = sum(s.raised for s in failing.values())
    if sum(s.sink_failures for s in stats) != raised:
        problems.append("sink failures were not all counted")
    if any(s.frames == 0 for s in stats):
        problems.append("a pipeline finished no frame")
    return SoakReport(
        duration_s=stop_at - start,
        frames={s.pipeline: s.frames for s in stats},
        swaps=swaps,
        swap_errors=swap_errors,
        events=sum(s.events for s in failing.values()),
        sink_failures=sum(s.sink_failures for s in stats),
        raised=raised,
        frame_failures=sum(s.frame_failures for s in stats),
        dropped_on_stop=sum(s.dropped_on_stop for s in stats),
        rss_start_mb=round(rss_start, 1),
        rss_end_mb=round(rss_end, 1),
        rss_samples_mb=[round(s, 1) for s in samples],
        rss_anon_samples_mb=[round(s, 1) for s in anon],
        rss_file_samples_mb=[round(s, 1) for s in files],
        sample_every_s=SAMPLE_EVERY_S,
        rss_growth=round(growth, 4),
        rss_judged_by=judged_by,
        threads_before=len(threads_before),
        threads_after=threading.active_count(),
        leaked_threads=leaked,
        stop_s=round(stop_s, 3),
        problems=problems,
    )


def _leftover_threads(before: set[int | None], wait_s: float = 5.0) -> list[str]:
    # Swap threads that are still compiling, or a source finishing its close, get a
    # moment; a thread still there after it is a leak.
    deadline = time.monotonic() + wait_s
    while True:
        extra = [t for t in threading.enumerate() if t.ident not in before]
        if not extra or time.monotonic() >= deadline:
            return sorted(t.name for t in extra)
        time.sleep(0.1)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--duration", type=float, default=1800.0, help="seconds to run")
    parser.add_argument("--swap-every", type=float, default=60.0, help="seconds between swaps")
    parser.add_argument("--fps", type=float, default=15.0, help="pace of each camera")
    parser.add_argument("--fail-every", type=int, default=50, help="the sink fails every N events")
    parser.add_argument("--video", type=Path, default=None, help="clip to loop (default: built)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    setup_logging(0)
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        layout = Layout.from_env(os.environ, state=Path(tmp) / "state")
        video = args.video or write_walk(Path(tmp) / "walk.avi", empty=5, crossing=10).path
        pool = ModelPool(Catalog(default_models_dir(), layout.cache))
        report = soak(
            pool,
            video,
            layout,
            args.duration,
            args.swap_every,
            fps=args.fps,
            fail_every=args.fail_every,
            say=lambda line: print(line, file=sys.stderr, flush=True),
        )
    if args.json:
        print(json.dumps(report.model_dump(mode="json")))
    else:
        for key, value in report.model_dump().items():
            print(f"{key}: {value}")
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
