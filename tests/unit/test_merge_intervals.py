"""Runs of one pipeline that ended between two telemetry ticks are reported as one interval.

Counts and time add up; a stage's count, max and mean stay exact; its p50 lands between
the parts' and its p95 and p99 never under any part's (an upper bound, never a flattering
one). Built from real histograms, so the exact figures are known.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edge_agent.telemetry.histogram import LatencyHistogram
from edge_agent.telemetry.stats import PipelineStats, merge_intervals, summarise


def _part(latencies_s: list[float], elapsed_s: float, dropped: int, calls: float) -> PipelineStats:
    histogram = LatencyHistogram()
    for value in latencies_s:
        histogram.record(value)
    return PipelineStats(
        pipeline="cam",
        frames=len(latencies_s),
        fps=len(latencies_s) / elapsed_s,
        fps_recent=0.0,
        dropped=dropped,
        elapsed_s=elapsed_s,
        stages={"infer": summarise(histogram)},
        sink_failures=1,
        calls_per_frame=calls,
        interval=True,
    )


latencies = st.lists(st.floats(1e-4, 0.5), min_size=1, max_size=40)


@given(
    runs=st.lists(
        st.tuples(latencies, st.floats(0.5, 100.0), st.integers(0, 5), st.floats(0.0, 4.0)),
        min_size=1,
        max_size=6,
    )
)
def test_merged_intervals_add_up_and_bound_the_percentiles(
    runs: list[tuple[list[float], float, int, float]],
) -> None:
    parts = [_part(*run) for run in runs]
    merged = merge_intervals(parts)
    every = [value for run in runs for value in run[0]]
    assert merged.frames == len(every)
    assert merged.dropped == sum(run[2] for run in runs)
    assert merged.sink_failures == len(runs)
    assert merged.elapsed_s == pytest.approx(sum(run[1] for run in runs))
    assert merged.fps == pytest.approx(len(every) / merged.elapsed_s)
    infer = merged.stages["infer"]
    assert infer.count == len(every)
    assert infer.max_ms == max(p.stages["infer"].max_ms for p in parts)
    assert infer.mean_ms == pytest.approx(1e3 * sum(every) / len(every), rel=1e-6)
    p50s = [p.stages["infer"].p50_ms for p in parts]
    assert min(p50s) - 1e-9 <= infer.p50_ms <= max(p50s) + 1e-9
    assert all(infer.p95_ms >= p.stages["infer"].p95_ms for p in parts)
    assert all(infer.p99_ms >= p.stages["infer"].p99_ms for p in parts)
    calls = sum(run[3] * len(run[0]) for run in runs) / len(every)
    assert merged.calls_per_frame == pytest.approx(calls)
    assert merged.interval


def test_one_interval_is_itself_and_none_is_an_error() -> None:
    part = _part([0.01, 0.02], 1.0, 0, 1.0)
    assert merge_intervals([part]) is part
    with pytest.raises(ValueError, match="nothing"):
        merge_intervals([])
