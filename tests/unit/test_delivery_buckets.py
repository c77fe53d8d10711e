"""Token buckets by device id: never more than the burst plus the rate, in fixed memory."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from edge_agent.delivery.buckets import TokenBuckets


@given(st.lists(st.floats(0.0, 5.0), max_size=200))
def test_a_key_never_gets_more_than_its_burst_and_its_rate(gaps: list[float]) -> None:
    buckets = TokenBuckets(capacity=10, per_s=2.0, max_keys=4)
    now, taken = 0.0, 0
    for gap in gaps:
        now += gap
        taken += buckets.take("box", now)
    assert taken <= 10 + 2.0 * now + 1e-9


def test_ids_past_the_limit_forget_the_least_recent_and_never_take_from_others() -> None:
    buckets = TokenBuckets(capacity=2, per_s=0.001, max_keys=3)
    assert buckets.take("a", 0.0)
    assert buckets.take("a", 0.0)
    assert not buckets.take("a", 0.0)  # spent
    for n in range(1000):  # invented ids, as many as a sender likes
        assert buckets.take(f"ghost-{n}", 0.0)
        assert len(buckets) <= 3
    assert buckets.take("a", 0.0)  # forgotten: a full bucket again, never an emptier one
    assert not buckets.take("b", 0.0, tokens=3)  # more than the burst: never
