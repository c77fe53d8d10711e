"""Per-pipeline telemetry: stage latencies, frame rate and drops, in fixed memory.

`PipelineTelemetry` is what a pipeline writes into on every frame;
`PipelineStats` is the frozen snapshot it hands to whoever publishes it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from pydantic import BaseModel, ConfigDict, Field

from edge_agent.telemetry.histogram import LatencyHistogram

DEFAULT_STAGES = ("read", "preprocess", "queue", "infer", "postprocess", "sink", "end_to_end")

RECENT_WINDOW_S = 5
"""Whole seconds covered by `fps_recent`, besides the current partial second."""


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
        self._clock = clock
        self._histograms = {stage: LatencyHistogram() for stage in stages}
        # Ring of per-second frame counts: slot s % N holds second s, tagged
        # with s so a slot left over from an older lap reads as empty.
        self._ring_counts = [0] * (RECENT_WINDOW_S + 1)
        self._ring_seconds = [-1] * (RECENT_WINDOW_S + 1)
        self._frames = 0
        self._dropped = 0
        self._start = clock()

    @property
    def stages(self) -> tuple[str, ...]:
        """Stage names, in the order given."""
        return tuple(self._histograms)

    def record(self, stage: str, seconds: float) -> None:
        """Add one latency to `stage`.

        Raises:
            KeyError: `stage` is not one of this pipeline's stages.
        """
        if not self.enabled:
            return
        self._histograms[stage].record(seconds)

    def frame_done(self) -> None:
        """Count one finished frame, for FPS."""
        second = int(self._clock())
        slot = second % len(self._ring_counts)
        if self._ring_seconds[slot] != second:
            self._ring_seconds[slot] = second
            self._ring_counts[slot] = 0
        self._ring_counts[slot] += 1
        self._frames += 1

    def add_dropped(self, n: int) -> None:
        """Add `n` frames to the drop counter."""
        self._dropped += n

    def set_dropped(self, n: int) -> None:
        """Set the drop counter, for sources that keep their own running total."""
        self._dropped = n

    def snapshot(self) -> PipelineStats:
        """Frame rate, drops and a latency summary per stage, as of now."""
        now = self._clock()
        elapsed = max(now - self._start, 0.0)
        return PipelineStats(
            pipeline=self.pipeline,
            frames=self._frames,
            fps=self._frames / elapsed if elapsed > 0 else 0.0,
            fps_recent=self._recent_fps(now, elapsed),
            dropped=self._dropped,
            elapsed_s=elapsed,
            stages={name: summarise(h) for name, h in self._histograms.items()},
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
        for histogram in self._histograms.values():
            histogram.reset()
        self._ring_counts = [0] * len(self._ring_counts)
        self._ring_seconds = [-1] * len(self._ring_seconds)
        self._frames = 0
        self._dropped = 0
        self._start = self._clock()
