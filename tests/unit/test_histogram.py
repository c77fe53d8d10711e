"""The latency histogram against numpy, its fixed memory, and the telemetry built on it."""

from __future__ import annotations

import math
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edge_agent.telemetry.histogram import LatencyHistogram
from edge_agent.telemetry.stats import PipelineTelemetry


def _lognormal(
    seed: int, mu: float, sigma: float, n: int
) -> np.ndarray[tuple[int], np.dtype[np.float64]]:
    return np.random.default_rng(seed).lognormal(mu, sigma, n)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    # Medians from ~50 µs to ~1 s: the range a pipeline stage actually spans.
    mu=st.floats(-10.0, 0.0),
    sigma=st.floats(0.05, 1.5),
    n=st.integers(1, 3000),
)
def test_percentiles_match_numpy_within_three_percent(
    seed: int, mu: float, sigma: float, n: int
) -> None:
    samples = _lognormal(seed, mu, sigma, n)
    histogram = LatencyHistogram()
    for x in samples.tolist():
        histogram.record(x)
    qs = [50.0, 95.0, 99.0]
    got = histogram.percentiles(qs)
    want = np.percentile(samples, qs)
    np.testing.assert_allclose(got, want, rtol=0.03)
    for q, value in zip(qs, got, strict=True):
        assert histogram.percentile(q) == value


def test_exact_summaries_and_end_percentiles() -> None:
    samples = _lognormal(1, -5.0, 1.0, 1000)
    histogram = LatencyHistogram()
    for x in samples.tolist():
        histogram.record(x)
    assert histogram.count == 1000
    assert histogram.min == samples.min()
    assert histogram.max == samples.max()
    assert math.isclose(histogram.mean, samples.mean(), rel_tol=1e-12)
    assert histogram.percentile(0.0) == samples.min()
    assert histogram.percentile(100.0) == samples.max()


def test_out_of_range_values_clamp_into_end_buckets_but_extremes_stay_exact() -> None:
    histogram = LatencyHistogram()
    for x in (1e-9, 0.0, 500.0, 0.01):
        histogram.record(x)
    assert histogram.min == 0.0
    assert histogram.max == 500.0
    assert histogram.percentile(100.0) == 500.0
    # The p75 sample (rank 2.25 of 0..3) lies between 0.01 and 500: within range.
    assert 0.01 < histogram.percentile(75.0) <= 500.0


def test_empty_histogram_reads_zero_and_nan_is_ignored() -> None:
    histogram = LatencyHistogram()
    histogram.record(float("nan"))
    assert histogram.count == 0
    assert (histogram.min, histogram.max, histogram.mean) == (0.0, 0.0, 0.0)
    assert histogram.percentile(99.0) == 0.0


def test_percentile_out_of_bounds_is_rejected() -> None:
    with pytest.raises(ValueError, match="percentile"):
        LatencyHistogram().percentile(101.0)


def test_memory_is_fixed_after_many_records() -> None:
    histogram = LatencyHistogram()
    size_before = histogram.nbytes
    samples = _lognormal(2, -6.0, 2.0, 100_000).tolist()
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        for x in samples:
            histogram.record(x)
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert histogram.count == 100_000
    assert histogram.nbytes == size_before
    # Keeping samples would cost at least 8 bytes each: 800 kB here.
    assert after - before < 4096


def test_merge_equals_recording_both() -> None:
    a_samples = _lognormal(3, -4.0, 1.0, 500).tolist()
    b_samples = _lognormal(4, -2.0, 0.5, 700).tolist()
    a, b, both = LatencyHistogram(), LatencyHistogram(), LatencyHistogram()
    for x in a_samples:
        a.record(x)
        both.record(x)
    for x in b_samples:
        b.record(x)
        both.record(x)
    a.merge(b)
    assert (a.count, a.min, a.max) == (both.count, both.min, both.max)
    assert math.isclose(a.mean, both.mean, rel_tol=1e-12)
    qs = [1.0, 25.0, 50.0, 90.0, 99.9]
    assert a.percentiles(qs) == both.percentiles(qs)


def test_merge_rejects_a_different_layout() -> None:
    with pytest.raises(ValueError, match="layout"):
        LatencyHistogram().merge(LatencyHistogram(rel_width=0.01))


def test_reset_forgets_samples() -> None:
    histogram = LatencyHistogram()
    histogram.record(0.5)
    histogram.reset()
    assert histogram.count == 0
    assert histogram.percentile(50.0) == 0.0
    histogram.record(0.002)
    assert histogram.min == histogram.max == 0.002


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_telemetry_snapshot_reports_stages_fps_and_drops() -> None:
    clock = FakeClock()
    telemetry = PipelineTelemetry("door", clock=clock)
    for _ in range(100):
        telemetry.record("infer", 0.010)
        telemetry.frame_done()
        clock.now += 0.1
    telemetry.add_dropped(3)
    telemetry.add_dropped(2)
    stats = telemetry.snapshot()
    assert stats.pipeline == "door"
    assert stats.frames == 100
    assert stats.dropped == 5
    assert math.isclose(stats.elapsed_s, 10.0)
    assert math.isclose(stats.fps, 10.0)
    assert math.isclose(stats.fps_recent, 10.0, rel_tol=0.1)
    infer = stats.stages["infer"]
    assert infer.count == 100
    assert math.isclose(infer.p50_ms, 10.0)
    assert math.isclose(infer.max_ms, 10.0)
    assert stats.stages["read"].count == 0
    telemetry.set_dropped(1)
    assert telemetry.snapshot().dropped == 1


def test_recent_fps_follows_a_slowdown_while_overall_fps_lags() -> None:
    clock = FakeClock()
    telemetry = PipelineTelemetry("door", clock=clock)
    for fps, seconds in ((30, 20), (5, 10)):
        for _ in range(fps * seconds):
            telemetry.frame_done()
            clock.now += 1.0 / fps
    stats = telemetry.snapshot()
    assert math.isclose(stats.fps, (600 + 50) / 30.0, rel_tol=1e-6)
    assert math.isclose(stats.fps_recent, 5.0, rel_tol=0.1)


def test_recent_fps_is_zero_after_a_stall() -> None:
    clock = FakeClock()
    telemetry = PipelineTelemetry("door", clock=clock)
    for _ in range(50):
        telemetry.frame_done()
        clock.now += 0.1
    clock.now += 60.0
    stats = telemetry.snapshot()
    assert stats.fps_recent == 0.0
    assert stats.frames == 50


def test_disabled_telemetry_records_nothing_but_counts_frames() -> None:
    telemetry = PipelineTelemetry("door", clock=FakeClock())
    telemetry.enabled = False
    telemetry.record("infer", 0.01)
    telemetry.frame_done()
    stats = telemetry.snapshot()
    assert stats.stages["infer"].count == 0
    assert stats.frames == 1


def test_unknown_stage_is_an_error() -> None:
    with pytest.raises(KeyError):
        PipelineTelemetry("door").record("nope", 0.1)


def test_reset_restarts_counters_and_clock() -> None:
    clock = FakeClock()
    telemetry = PipelineTelemetry("door", stages=("infer",), clock=clock)
    telemetry.record("infer", 0.01)
    telemetry.frame_done()
    telemetry.add_dropped(4)
    clock.now += 7.0
    telemetry.reset()
    clock.now += 1.0
    stats = telemetry.snapshot()
    assert (stats.frames, stats.dropped, stats.fps_recent) == (0, 0, 0.0)
    assert math.isclose(stats.elapsed_s, 1.0)
    assert stats.stages["infer"].count == 0
    assert telemetry.stages == ("infer",)


def test_interval_reports_the_last_interval_and_keeps_the_whole_run() -> None:
    clock = FakeClock()
    telemetry = PipelineTelemetry("door", stages=("infer",), clock=clock)
    # First interval: 10 s at 10 FPS, 10 ms each, 2 frames dropped.
    for _ in range(100):
        telemetry.record("infer", 0.010)
        telemetry.frame_done()
        clock.now += 0.1
    telemetry.set_dropped(2)
    telemetry.count("sink_failures")
    first = telemetry.interval()
    assert first.interval
    assert (first.frames, first.dropped, first.sink_failures) == (100, 2, 1)
    assert math.isclose(first.elapsed_s, 10.0)
    assert math.isclose(first.fps, 10.0)
    assert math.isclose(first.stages["infer"].p50_ms, 10.0)
    # Second interval: 5 s at 8 FPS, 100 ms each with one 400 ms outlier, 3 more drops.
    for i in range(40):
        telemetry.record("infer", 0.400 if i == 7 else 0.100)
        telemetry.frame_done()
        clock.now += 0.125
    telemetry.set_dropped(5)
    second = telemetry.interval()
    assert (second.frames, second.dropped, second.sink_failures) == (40, 3, 0)
    assert math.isclose(second.elapsed_s, 5.0)
    assert math.isclose(second.fps, 8.0)
    infer = second.stages["infer"]
    assert infer.count == 40
    assert math.isclose(infer.p50_ms, 100.0, rel_tol=0.02)
    assert math.isclose(infer.p95_ms, 100.0, rel_tol=0.02)
    assert math.isclose(infer.max_ms, 400.0)
    # The whole run is untouched by the intervals.
    whole = telemetry.snapshot()
    assert not whole.interval
    assert (whole.frames, whole.dropped, whole.sink_failures) == (140, 5, 1)
    assert math.isclose(whole.elapsed_s, 15.0)
    assert whole.stages["infer"].count == 140
    assert math.isclose(whole.stages["infer"].p50_ms, 10.0, rel_tol=0.02)
    # An interval with nothing in it reads as zeros, not as the last one again.
    clock.now += 1.0
    empty = telemetry.interval()
    assert (empty.frames, empty.fps, empty.stages["infer"].count) == (0, 0.0, 0)


def test_counters_reach_the_snapshot_and_reset_with_it() -> None:
    telemetry = PipelineTelemetry("door", clock=FakeClock())
    telemetry.count("frame_failures", 2)
    telemetry.count("dropped_on_stop", 3)
    stats = telemetry.snapshot()
    assert (stats.frame_failures, stats.dropped_on_stop) == (2, 3)
    telemetry.reset()
    assert telemetry.snapshot().dropped_on_stop == 0
