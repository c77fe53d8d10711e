"""argparse types both command lines take (`edge-agent` and `edge-fleet`): whole numbers,
seconds and days with bounds, and topic prefixes.

Below both CLIs, so that `edge_agent.fleet` does not import `edge_agent.cli`: a
fleet-side module importing the box's command line climbed a floor (docs/ARCHITECTURE.md).
The standard library only, as `cli.common`, which re-exports these, needs.
"""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    """argparse type: an integer of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not at least 1")
    return value


MAX_SECONDS = 7 * 24 * 3600.0
"""The longest wait or run a seconds flag takes: past it a clock overflows (1e300 s was a
traceback in the health gate), and no wait of a week is meant."""
MAX_DAYS = 3650.0
"""The longest lifetime a days flag takes (ten years; 1e300 days overflowed timedelta)."""


def _bounded(text: str, unit: str, most: float) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value <= most:  # also refuses NaN
        raise argparse.ArgumentTypeError(
            f"{text} is not a number of {unit} above 0 and at most {most:,.0f}"
        )
    return value


def positive_float(text: str) -> float:
    """argparse type: seconds, above 0 and at most MAX_SECONDS."""
    return _bounded(text, "seconds", MAX_SECONDS)


def positive_days(text: str) -> float:
    """argparse type: days, above 0 and at most MAX_DAYS."""
    return _bounded(text, "days", MAX_DAYS)


def topic_prefix(text: str) -> str:
    """argparse type: an MQTT topic prefix (protocol.topics.check_prefix)."""
    from edge_agent.protocol.topics import check_prefix

    try:
        return check_prefix(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None
