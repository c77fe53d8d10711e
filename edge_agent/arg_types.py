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


def mirror_url(text: str) -> str:
    """argparse type: where a mirror serves a release's files, http(s):// or file://, as the
    release's `url` takes them (one that a box cannot fetch fails every deploy)."""
    from urllib.parse import urlsplit

    parts = urlsplit(text)
    if parts.scheme not in ("http", "https", "file") or not (parts.netloc or parts.path):
        raise argparse.ArgumentTypeError(f"{text!r} is not an http://, https:// or file:// URL")
    if parts.query or parts.fragment:
        raise argparse.ArgumentTypeError(
            f"{text!r}: a file's name is added to the URL's path; it takes no ?query or #"
        )
    return text


def _one_level(text: str, what: str) -> str:
    """`text` if it can be one topic level, as the agent's config takes ids; else a usage
    error naming `what` it should be."""
    from edge_agent.paths import is_safe_name

    if not is_safe_name(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a {what}: letters, digits, '-', '_' and '.', starting with a "
            "letter or digit"
        )
    return text


def device_id(text: str) -> str:
    """argparse type: a device id as the agent's config takes it, one topic level.

    `edge-fleet cmd + ping`, a natural guess at "every box", was a paho traceback (no
    wildcards in a topic to publish on), and `a/b` waited its whole timeout on a topic no
    box reads. (A group's members: deploy --group, or cmd on each.)
    """
    from edge_agent.protocol.topics import RESERVED_IDS

    if _one_level(text, "device id") in RESERVED_IDS:
        raise argparse.ArgumentTypeError(
            f"{text!r} names fleet-wide topics ({', '.join(sorted(RESERVED_IDS))}), no device"
        )
    return text


def group_name(text: str) -> str:
    """argparse type: a group name, one topic level as the agent's config takes it."""
    return _one_level(text, "group name")


def command_type(text: str) -> str:
    """argparse type: a command type the envelope can carry, known or not (`--no-check`,
    where one too long was a pydantic traceback)."""
    from edge_agent.protocol.agent import COMMAND_TYPE_MAX

    if not 0 < len(text) <= COMMAND_TYPE_MAX:
        raise argparse.ArgumentTypeError(
            f"a command type has 1 to {COMMAND_TYPE_MAX} characters, not {len(text)}"
        )
    return text
