"""A fixed-memory latency histogram with log-spaced buckets.

A pipeline records several latencies per frame for as long as it runs (days,
on an edge box), so the histogram keeps counts per bucket, never the samples:
its memory is the same after ten samples or ten billion. Buckets grow
geometrically, so every bucket has the same *relative* width and a percentile
read back is within half a bucket (about 1%) of the true one, whether the
stage takes microseconds or seconds.

Threading: each histogram has one writer. A reader (the telemetry snapshot)
may read while it writes; it may then see a count one sample ahead of the
sum or the buckets, which a snapshot tolerates. `record` takes no lock because
a lock would cost more than the rest of `record` put together.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence

import numpy as np

_INT64 = "q"


class LatencyHistogram:
    """Counts of latencies in log-spaced buckets from `lowest_s` to `highest_s`.

    Bucket `i` holds values in `[lowest_s * g**i, lowest_s * g**(i+1))` with
    `g = 1 + rel_width`. Values outside the range are counted in the end
    buckets, while `min` and `max` stay exact.

    Args:
        lowest_s: Lower edge of the first bucket, in seconds.
        highest_s: Upper edge of the range, in seconds.
        rel_width: Relative width of each bucket (0.02 means 2%).
    """

    __slots__ = (
        "_count",
        "_counts",
        "_growth",
        "_highest",
        "_inv_log_growth",
        "_inv_lowest",
        "_last",
        "_lowest",
        "_max",
        "_min",
        "_sum",
    )

    def __init__(
        self, lowest_s: float = 1e-6, highest_s: float = 100.0, rel_width: float = 0.02
    ) -> None:
        if not 0.0 < lowest_s < highest_s:
            raise ValueError(f"need 0 < lowest_s < highest_s, got {lowest_s}, {highest_s}")
        if not 0.0 < rel_width <= 1.0:
            raise ValueError(f"rel_width must be in (0, 1], got {rel_width}")
        self._lowest = lowest_s
        self._highest = highest_s
        self._growth = 1.0 + rel_width
        # Precomputed reciprocals: record() multiplies instead of dividing.
        self._inv_lowest = 1.0 / lowest_s
        self._inv_log_growth = 1.0 / math.log(self._growth)
        n_buckets = math.ceil(math.log(highest_s / lowest_s) * self._inv_log_growth)
        self._last = n_buckets - 1
        self._counts = array(_INT64, bytes(8 * n_buckets))
        self._count = 0
        self._sum = 0.0
        self._min = math.inf
        self._max = -math.inf

    def record(self, seconds: float) -> None:
        """Count one latency. NaN is ignored; zero and negatives land in the first bucket."""
        if seconds != seconds:  # NaN: a broken clock must not poison the mean.
            return
        if seconds < self._min:
            self._min = seconds
        if seconds > self._max:
            self._max = seconds
        self._sum += seconds
        if seconds <= self._lowest:
            index = 0
        elif seconds >= self._highest:
            index = self._last
        else:
            index = int(math.log(seconds * self._inv_lowest) * self._inv_log_growth)
            # Rounding at a bucket's top edge can land one past the end.
            if index > self._last:
                index = self._last
        self._counts[index] += 1
        self._count += 1

    @property
    def count(self) -> int:
        """Samples recorded."""
        return self._count

    @property
    def min(self) -> float:
        """Smallest sample, exact; 0.0 when empty."""
        return self._min if self._count else 0.0

    @property
    def max(self) -> float:
        """Largest sample, exact; 0.0 when empty."""
        return self._max if self._count else 0.0

    @property
    def mean(self) -> float:
        """Mean of the samples, exact; 0.0 when empty."""
        count = self._count
        return self._sum / count if count else 0.0

    @property
    def nbytes(self) -> int:
        """Bytes held by the bucket counts: fixed at construction."""
        return self._counts.itemsize * len(self._counts)

    def percentile(self, q: float) -> float:
        """The q-th percentile (q in 0..100), as numpy's default (linear) method defines it.

        Returns:
            Seconds, within half a bucket's relative width of the true
            percentile (clamped to the exact min and max); 0.0 when empty.
        """
        return self.percentiles([q])[0]

    def percentiles(self, qs: Sequence[float]) -> list[float]:
        """Several percentiles from one pass over the buckets; see `percentile`."""
        for q in qs:
            if not 0.0 <= q <= 100.0:
                raise ValueError(f"percentile must be in [0, 100], got {q}")
        # Copy first: the writer may be adding to the live buckets meanwhile.
        counts = np.array(self._counts, dtype=np.int64)
        cumulative = np.cumsum(counts)
        total = int(cumulative[-1])
        if total == 0:
            return [0.0 for _ in qs]
        low, high = self._min, self._max
        out = []
        for q in qs:
            rank = q / 100.0 * (total - 1)
            below = math.floor(rank)
            above = min(below + 1, total - 1)
            a = self._sample_value(cumulative, below, total, low, high)
            b = self._sample_value(cumulative, above, total, low, high)
            # Interpolating the estimates keeps the error relative: each end is
            # within half a bucket, so the weighted mix is too.
            out.append(a + (rank - below) * (b - a))
        return out

    def _sample_value(
        self,
        cumulative: np.ndarray[tuple[int], np.dtype[np.int64]],
        k: int,
        total: int,
        low: float,
        high: float,
    ) -> float:
        """Estimate of the k-th smallest sample (0-based)."""
        if k == 0:
            return low
        if k == total - 1:
            return high
        index = int(np.searchsorted(cumulative, k, side="right"))
        # The geometric middle of the bucket halves the worst relative error.
        middle: float = self._lowest * self._growth ** (index + 0.5)
        return min(max(middle, low), high)

    def counts_at_most(self, bounds_s: Sequence[float]) -> tuple[list[int], int]:
        """Samples at or below each bound, and the total, from one copy of the buckets.

        For cumulative (Prometheus `le`) buckets. A bound between the exact min and
        max counts the whole bucket it falls in, so it may over-count by the samples
        within one bucket width (2%) above it; below the min it is 0, at or above
        the max it is the total.

        Returns:
            (count per bound, total); the total equals the last bucket's cumulative count.
        """
        counts = np.array(self._counts, dtype=np.int64)
        cumulative = np.cumsum(counts)
        total = int(cumulative[-1])
        low, high = self._min, self._max
        out = []
        for bound in bounds_s:
            if total == 0 or bound < low:
                out.append(0)
            elif bound >= high:
                out.append(total)
            else:
                out.append(int(cumulative[self._index(bound)]))
        return out, total

    def _index(self, seconds: float) -> int:
        """The bucket `record` puts `seconds` in (record inlines this: it is the hot path)."""
        if seconds <= self._lowest:
            return 0
        if seconds >= self._highest:
            return self._last
        return min(int(math.log(seconds * self._inv_lowest) * self._inv_log_growth), self._last)

    def merge(self, other: LatencyHistogram) -> None:
        """Add `other`'s samples to this histogram (same bucket layout required)."""
        if (other._lowest, other._highest, other._growth) != (
            self._lowest,
            self._highest,
            self._growth,
        ):
            raise ValueError("cannot merge histograms with different bucket layouts")
        if other._count == 0:
            return
        merged = np.add(
            np.frombuffer(self._counts, dtype=np.int64),
            np.frombuffer(other._counts, dtype=np.int64),
        )
        self._counts = array(_INT64, merged.tobytes())
        self._count += other._count
        self._sum += other._sum
        self._min = min(self._min, other._min)
        self._max = max(self._max, other._max)

    def reset(self) -> None:
        """Forget every sample, keeping the bucket layout."""
        self._counts = array(_INT64, bytes(8 * len(self._counts)))
        self._count = 0
        self._sum = 0.0
        self._min = math.inf
        self._max = -math.inf
