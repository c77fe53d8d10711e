"""What a command refused as expired says: the times involved, and a clock to check.

On MQTT 3.1.1 (no message expiry) the box's own clock decides whether a command has
expired. A box whose clock ran a year ahead refused every command with "expired at
<unix seconds>; send it again with a later expires_at": true, and no help, since every
resend expired too. The answer now sets the box's clock against the console's `sent_at`,
and past `CLOCK_SUSPECT_S` says to check the box's clock.
"""

from __future__ import annotations

from datetime import UTC, datetime

from edge_agent.errors import EdgeAgentError

CLOCK_SUSPECT_S = 300.0
"""The box's clock this far past a command's `sent_at` points at the clock: a command
rarely takes five minutes to arrive, though one held for a box that was offline can."""


def expired_error(command_id: str, sent_at: float, expires_at: float, now: float) -> EdgeAgentError:
    """The command.expired error for a command the box's clock (`now`) has past."""
    ahead = now - sent_at
    problem = (
        f"command {command_id} expired at {_utc(expires_at)} (sent at {_utc(sent_at)}); "
        f"this box's clock reads {_utc(now)}, {_span(ahead)} after it was sent"
    )
    if ahead > CLOCK_SUSPECT_S:
        return EdgeAgentError(
            problem,
            "check this box's clock (NTP: `timedatectl`): unless the command waited that "
            "long for the box, the clock is ahead and every command will expire; then send "
            "it again",
            code="command.expired",
        )
    return EdgeAgentError(problem, "send it again with a later expires_at", code="command.expired")


def waited_error(command_id: str, expires_at: float) -> EdgeAgentError:
    """The command.expired error for a command that expired while it waited to run."""
    return EdgeAgentError(
        f"command {command_id} expired at {_utc(expires_at)} while it waited its turn to run",
        "send it again with a later expires_at, or once the box is less busy (get_status jobs)",
        code="command.expired",
    )


def _utc(ts: float) -> str:
    try:
        return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (OverflowError, OSError, ValueError):  # a year past 9999 is still a time to show
        return f"{ts:.0f} (Unix seconds)"


def _span(seconds: float) -> str:
    """`35 s`, `2.5 h`, `365.0 days`: a skew a person reads at a glance."""
    size = abs(seconds)
    if size < 120:
        text = f"{size:.0f} s"
    elif size < 7200:
        text = f"{size / 60:.1f} min"
    elif size < 172800:
        text = f"{size / 3600:.1f} h"
    else:
        text = f"{size / 86400:.1f} days"
    return text if seconds >= 0 else f"-{text}"
