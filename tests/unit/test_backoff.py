"""The reconnect backoff: bounded, exponential, and spread even on its first retry.

After a lost link every box starts its backoff again at attempt 0. Were the first delay a
single value, a fleet whose broker restarted would reconnect in one instant.
"""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from edge_agent.comms.session import backoff_delay


@given(
    attempt=st.integers(0, 100),
    low=st.floats(0.01, 5.0),
    spread=st.floats(1.0, 100.0),
    seed=st.integers(0, 2**32 - 1),
)
def test_a_delay_stays_between_the_bounds_and_the_doubling(
    attempt: int, low: float, spread: float, seed: int
) -> None:
    high = low * spread
    delay = backoff_delay(attempt, low, high, random.Random(seed))
    assert low <= delay <= high
    assert delay <= low * 2 ** (attempt + 1) * (1 + 1e-12)


def test_the_first_retry_of_a_fleet_is_spread_over_twice_the_shortest_delay() -> None:
    rng = random.Random(7)
    delays = [backoff_delay(0, 0.5, 30.0, rng) for _ in range(5000)]
    assert min(delays) >= 0.5
    assert max(delays) <= 1.0
    # 5,000 boxes spread over the half second, not in one instant: each tenth of it holds
    # about a tenth of them.
    tenths = [sum(0.5 + k * 0.05 <= d < 0.5 + (k + 1) * 0.05 for d in delays) for k in range(10)]
    assert all(350 <= n <= 650 for n in tenths), tenths


def test_the_ceiling_doubles_until_the_longest_delay() -> None:
    rng = random.Random(3)
    for attempt, ceiling in ((0, 1.0), (1, 2.0), (2, 4.0), (5, 30.0), (60, 30.0)):
        delays = [backoff_delay(attempt, 0.5, 30.0, rng) for _ in range(2000)]
        assert max(delays) <= ceiling
        assert max(delays) > 0.9 * ceiling, (attempt, max(delays))
