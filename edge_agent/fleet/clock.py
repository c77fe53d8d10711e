"""How far a box's clock is from the console's, from what the console already receives.

Every message carries the box's `ts`, made on its own clock; the console knows when the
message arrived on its own. A message is made before it arrives, so `ts - arrival` is a
lower bound of how far ahead the box's clock is (a year ahead shows at once, a retained
birth included). A birth that arrives live was made a moment before, so its `ts -
arrival` is the skew itself, ahead or behind. A command's answer was made between the
send and the arrival: outside that window, the clock is off by at least the distance to
it. Pure: times in, seconds out; the caller reads the clock.
"""

from __future__ import annotations

import math
import time

CLOCK_TOLERANCE_S = 300.0
"""A skew past this is flagged: NTP keeps a box within a second, a wrong timezone or a
dead RTC battery puts it hours or decades off; a few seconds of network delay are not it."""


def skew_after(held: float | None, ts: float, arrived: float, *, live_birth: bool) -> float | None:
    """The box's estimated skew (box clock minus console clock, seconds) after one message.

    Args:
        held: The estimate so far, None when there is none.
        ts: The message's `ts`, on the box's clock.
        arrived: When it arrived, on the console's clock.
        live_birth: The message is an online state that arrived live (not retained), so it
            was made a moment before it arrived: its estimate replaces the one held.

    Returns:
        The new estimate; None while nothing says anything (an old retained state says
        only that the box's clock was not ahead when it was made).
    """
    if not math.isfinite(ts):
        # JSON takes Infinity and NaN, and so does the model: one such message from
        # anything that may write a state topic ended `watch` at round(inf).
        return held
    seen = ts - arrived
    if live_birth:
        return seen
    # A lower bound only: it corrects an estimate towards ahead (a clock that jumped
    # forward, or one fixed after a birth that saw it behind), never towards behind.
    if seen > (held if held is not None else 0.0):
        return seen
    return held


def skew_of_answer(ts: float, sent: float, arrived: float) -> float:
    """The skew an answer shows: 0 when its `ts` falls between the send and the arrival
    (console clock), else the distance to that window (positive: the box is ahead)."""
    if ts > arrived:
        return ts - arrived
    if ts < sent:
        return ts - sent
    return 0.0


def calendar(ts: float) -> str | None:
    """`ts` as the console's local date and time, or None when it is no time the calendar
    holds: a box's Infinity, NaN or 1e300 raised out of `time.localtime`."""
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))
    except (OverflowError, OSError, ValueError):
        return None


def off(skew: float | None) -> bool:
    """Whether the skew is past the tolerance: the box's own times cannot be trusted."""
    return skew is not None and abs(skew) > CLOCK_TOLERANCE_S


def span(seconds: float) -> str:
    """A signed short span, to the nearest unit: +365d, -3h, +7m (an estimate a few
    milliseconds short of two days is two days, not one)."""
    if not math.isfinite(seconds):
        return "?"
    sign = "+" if seconds >= 0 else "-"
    size = abs(seconds)
    for unit, length in (("d", 86400), ("h", 3600), ("m", 60)):
        if size >= length:
            return f"{sign}{round(size / length)}{unit}"
    return f"{sign}{round(size)}s"
