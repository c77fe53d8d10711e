"""What edge-agent knows of a wall clock it cannot trust.

Edge boxes often have no clock battery. They boot in 1970, or at the date their image was
built, and NTP steps the clock when it first syncs, by years, and on an offline site
never. Durations, deadlines and rates are measured on the monotonic clock; the wall clock
labels messages and judges ages and expiries, and those judgements need a floor.
"""

from __future__ import annotations

from datetime import UTC, datetime

CLOCK_FLOOR = 1_735_689_600.0
"""2025-01-01 UTC. No edge-agent release is older, so a clock reading or a file time
before it comes from a clock that was not set."""

CLOCK_FLOOR_UTC = datetime.fromtimestamp(CLOCK_FLOOR, UTC)


def is_set(ts: float) -> bool:
    """Whether a wall-clock reading (Unix seconds) can be a real date."""
    return ts >= CLOCK_FLOOR
