"""Per-pipeline telemetry: stage latencies, frame rate and drops, in fixed memory.

`PipelineTelemetry` is what a pipeline writes into on every frame;
`PipelineStats` is the frozen snapshot it hands to whoever publishes it: over
the whole run (`snapshot`) or over the interval since the last `interval()`
call, which is what the agent publishes every N seconds.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from edge_agent.telemetry.histogram import LatencyHistogram

DEFAULT_STAGES = ("read", "preprocess", "queue", "infer", "postprocess", "sink", "end_to_end")

RECENT_WINDOW_S = 5
"""Whole seconds covered by `fps_recent`, besides the current partial second."""

Counter = Literal["sink_failures", "frame_failures", "dropped_on_stop"]
COUNTERS: tuple[Counter, ...] = ("sink_failures", "frame_failures", "dropped_on_stop")


class StageSummary(BaseModel):
    """Latency of one stage over the run, in milliseconds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    count: int = Field(ge=0, description="Samples recorded for this stage.")
    p50_ms: float = Field(description="Median latency in milliseconds (within ~1%).")
    p95_ms: float = Field(description="95th percentile latency in milliseconds (within ~1%).")
    p99_ms: float = Field(description="99th percentile latency in milliseconds (within ~1%).")
    max_ms: float = Field(description="Largest latency in milliseconds, exact.")
    mean_ms: float = Field(description="Mean latency in milliseconds, exact.")


class PipelineStats(BaseModel):
    """A snapshot of one pipeline's throughput and stage latencies."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pipeline: str = Field(description="Pipeline name.")
    frames: int = Field(ge=0, description="Frames (or audio windows) finished since the start.")
    fps: float = Field(ge=0.0, description="Frames per second over the whole run.")
    fps_recent: float = Field(
        ge=0.0, description=f"Frames per second over about the last {RECENT_WINDOW_S} seconds."
    )
    dropped: int = Field(ge=0, description="Frames the source discarded because we were slow.")
    elapsed_s: float = Field(ge=0.0, description="Seconds since telemetry started or was reset.")
    stages: dict[str, StageSummary] = Field(description="Latency per stage, by stage name.")
    sink_failures: int = Field(
        default=0, ge=0, description="Times a sink raised (emit or close); the others were served."
    )
    frame_failures: int = Field(
        default=0,
        ge=0,
        description="Frames with no result: the head raised, or the engine never returned them.",
    )
    dropped_on_stop: int = Field(
        default=0, ge=0, description="Frames in flight at stop() that could not finish in time."
    )
    mode: str = Field(
        default="frame",
        description="Detection mode: frame, tiles or regions (audio pipelines: frame).",
    )
    calls_per_frame: float = Field(
        default=0.0,
        ge=0.0,
        description="Mean model calls per finished frame (tiles and regions make several, "
        "or none); what a camera costs.",
    )
    interval: bool = Field(
        default=False,
        description="True when every figure covers only the interval since the previous one.",
    )


def merge_intervals(parts: Sequence[PipelineStats]) -> PipelineStats:
    """Interval snapshots of one pipeline, in order, as one: the runs of a pipeline that
    ended between two telemetry ticks (a camera retried every few seconds, a telemetry
    interval of an hour).

    Counts and time add up; each stage's count, max and mean are exact; its p50 is the
    count-weighted mean of the parts' and its p95 and p99 the largest of theirs, which can
    only err high. The rest (fps_recent, mode, interval) is the last part's.
    """
    if not parts:
        raise ValueError("nothing to merge")
    last = parts[-1]
    if len(parts) == 1:
        return last
    frames = sum(p.frames for p in parts)
    elapsed = sum(p.elapsed_s for p in parts)
    stages: dict[str, StageSummary] = {}
    for name in dict.fromkeys(n for p in parts for n in p.stages):
        seen = [p.stages[name] for p in parts if name in p.stages]
        counted = [s for s in seen if s.count > 0]
        if not counted:
            stages[name] = seen[-1]
            continue
        count = sum(s.count for s in counted)
        stages[name] = StageSummary(
            count=count,
            p50_ms=sum(s.p50_ms * s.count for s in counted) / count,
            p95_ms=max(s.p95_ms for s in counted),
            p99_ms=max(s.p99_ms for s in counted),
            max_ms=max(s.max_ms for s in counted),
            mean_ms=sum(s.mean_ms * s.count for s in counted) / count,
        )
    weighted = sum(p.calls_per_frame * p.frames for p in parts)
    calls = weighted / frames if frames else last.calls_per_frame
    return last.model_copy(
        update={
            "frames": frames,
            "fps": frames / elapsed if elapsed > 0 else 0.0,
            "dropped": sum(p.dropped for p in parts),
            "elapsed_s": elapsed,
            "stages": stages,
            "sink_failures": sum(p.sink_failures for p in parts),
            "frame_failures": sum(p.frame_failures for p in parts),
            "dropped_on_stop": sum(p.dropped_on_stop for p in parts),
            "calls_per_frame": calls,
        }
    )


def summarise(histogram: LatencyHistogram) -> StageSummary:
    """The millisecond summary of one histogram."""
    p50, p95, p99 = histogram.percentiles([50.0, 95.0, 99.0])
    return StageSummary(
        count=histogram.count,
        p50_ms=p50 * 1e3,
        p95_ms=p95 * 1e3,
        p99_ms=p99 * 1e3,
        max_ms=histogram.max * 1e3,
        mean_ms=histogram.mean * 1e3,
    )


class PipelineTelemetry:
    """One latency histogram per stage, plus frame and drop counters.

    The clock starts at construction and restarts at `reset()`; call `reset()`
    when the pipeline actually starts if it was built earlier.

    Threading: each stage has one writing thread (stages may live on
    different threads), and `frame_done` is called from one thread; `snapshot`
    may run on any thread and tolerates being a sample out of step.

    Args:
        pipeline: Pipeline name, copied into every snapshot.
        stages: Stage names that `record` accepts.
        clock: Monotonic seconds; injectable so tests control time.
    """

    def __init__(
        self,
        pipeline: str,
        stages: tuple[str, ...] = DEFAULT_STAGES,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.pipeline = pipeline
        # Switched off to measure telemetry's own cost: `record` then returns at
        # once. Frames and drops are still counted; FPS is the pipeline's output.
        self.enabled = True
        self.mode = "frame"
        """The detection mode, copied into every snapshot (the pipeline sets it)."""
        self._clock = clock
        self._histograms = {stage: LatencyHistogram() for stage in stages}
        self._interval = {stage: LatencyHistogram() for stage in stages}
        # Ring of per-second frame counts: slot s % N holds second s, tagged
        # with s so a slot left over from an older lap reads as empty.
        self._ring_counts = [0] * (RECENT_WINDOW_S + 1)
        self._ring_seconds = [-1] * (RECENT_WINDOW_S + 1)
        self._frames = 0
        self._calls = 0
        self._dropped = 0
        self._counters: dict[str, int] = dict.fromkeys(COUNTERS, 0)
        self._start = clock()
        # What the counters read when the current interval began.
        self._interval_start = self._start
        self._interval_base = self._totals()

    @property
    def stages(self) -> tuple[str, ...]:
        """Stage names, in the order given."""
        return tuple(self._histograms)

    def histogram(self, stage: str) -> LatencyHistogram:
        """The whole-run histogram of `stage`, live: for exporters that need the buckets."""
        return self._histograms[stage]

    def record(self, stage: str, seconds: float) -> None:
        """Add one latency to `stage`.

        Raises:
            KeyError: `stage` is not one of this pipeline's stages.
        """
        if not self.enabled:
            return
        self._histograms[stage].record(seconds)
        # Recorded twice rather than merged at interval() so that a sample recorded
        # while interval() runs can only land in the wrong interval, never be lost.
        self._interval[stage].record(seconds)

    def frame_done(self, calls: int = 1) -> None:
        """Count one finished frame, for FPS, and the model calls it took."""
        second = int(self._clock())
        slot = second % len(self._ring_counts)
        if self._ring_seconds[slot] != second:
            self._ring_seconds[slot] = second
            self._ring_counts[slot] = 0
        self._ring_counts[slot] += 1
        self._frames += 1
        self._calls += calls

    def add_dropped(self, n: int) -> None:
        """Add `n` frames to the drop counter."""
        self._dropped += n

    def set_dropped(self, n: int) -> None:
        """Set the drop counter, for sources that keep their own running total."""
        self._dropped = n

    def count(self, counter: Counter, n: int = 1) -> None:
        """Add `n` to one of the failure counters (see `PipelineStats` for their meaning)."""
        self._counters[counter] += n

    def snapshot(self) -> PipelineStats:
        """Frame rate, drops, failures and a latency summary per stage, over the whole run."""
        now = self._clock()
        elapsed = max(now - self._start, 0.0)
        return self._stats(now, elapsed, self._totals(), self._histograms, interval=False)

    def interval(self) -> PipelineStats:
        """The same figures over the interval since the previous call (or the start), then
        start a new interval; the whole-run figures are untouched.

        Callable from any thread (the agent's publisher) while the pipeline records.
        """
        now = self._clock()
        totals = self._totals()
        histograms, self._interval = (
            self._interval,
            {stage: LatencyHistogram() for stage in self._histograms},
        )
        base, self._interval_base = self._interval_base, totals
        start, self._interval_start = self._interval_start, now
        delta = {key: totals[key] - base[key] for key in totals}
        return self._stats(now, max(now - start, 0.0), delta, histograms, interval=True)

    def _totals(self) -> dict[str, int]:
        return {
            "frames": self._frames,
            "calls": self._calls,
            "dropped": self._dropped,
            **self._counters,
        }

    def _stats(
        self,
        now: float,
        elapsed: float,
        counts: dict[str, int],
        histograms: dict[str, LatencyHistogram],
        *,
        interval: bool,
    ) -> PipelineStats:
        frames = counts["frames"]
        return PipelineStats(
            pipeline=self.pipeline,
            frames=frames,
            fps=frames / elapsed if elapsed > 0 else 0.0,
            fps_recent=self._recent_fps(now, max(now - self._start, 0.0)),
            # A source that restarted its own count can make a delta negative.
            dropped=max(0, counts["dropped"]),
            elapsed_s=elapsed,
            stages={name: summarise(h) for name, h in histograms.items()},
            sink_failures=counts["sink_failures"],
            frame_failures=counts["frame_failures"],
            dropped_on_stop=counts["dropped_on_stop"],
            mode=self.mode,
            calls_per_frame=counts["calls"] / frames if frames > 0 else 0.0,
            interval=interval,
        )

    def _recent_fps(self, now: float, elapsed: float) -> float:
        current = int(now)
        oldest = current - RECENT_WINDOW_S
        frames = sum(
            count
            for count, second in zip(self._ring_counts, self._ring_seconds, strict=True)
            if oldest <= second <= current
        )
        # The window is the last whole seconds plus the current partial one,
        # but never longer than the run: early on, the run is the window.
        window = min(RECENT_WINDOW_S + (now - current), elapsed)
        return frames / window if window > 0 else 0.0

    def reset(self) -> None:
        """Forget every sample and counter and restart the clock."""
        for histogram in (*self._histograms.values(), *self._interval.values()):
            histogram.reset()
        self._ring_counts = [0] * len(self._ring_counts)
        self._ring_seconds = [-1] * len(self._ring_seconds)
        self._frames = 0
        self._calls = 0
        self._dropped = 0
        self._counters = dict.fromkeys(COUNTERS, 0)
        self._start = self._clock()
        self._interval_start = self._start
        self._interval_base = self._totals()
