"""Which joins a broadcaster takes from one device id (pure: fed the time).

Every puller of a release writes the same `ctl` topic, so a broker's ACL cannot keep a
box from writing joins in any name: a `device_id` there is whatever its sender wrote. A
join restarts an idle broadcast, puts back every chunk its bitmap asks for, and moves
its puller to the head of the window, which the broadcaster then holds for it until it
acks or `stall_s` passes. A fake puller that rejoined every 1.4 s and never acked held
the window for as long as it went on; one that rejoined in a real puller's name asked
for the whole release again each time.

A real puller joins, then rejoins only after `idle_s` (2 s) without a frame, at most
twice in a row before it repairs; a frame that arrives (and which it acks) restores
that. So one device id may join:

- at most `burst` times at once, then `per_s` times a second: the rejoins of a puller
  on a link that keeps failing, and no faster;
- at most `unacked` times with no ack from it in between that moved it on in the window
  (an ack of a frame it had not acked yet): a join and its two rejoins. A fake puller
  that never acks is refused after that (and the window drops it `stall_s` later); a
  stale ack does not count, and one that acks the frames does not hold the window back.

Both are per device id, and ids are free: a flood of new names is bounded by the
broadcast's `max_pullers` and its paced statuses, not here.
"""

from __future__ import annotations

from dataclasses import dataclass

from edge_agent.delivery.buckets import TokenBuckets


@dataclass(frozen=True, slots=True)
class JoinLimits:
    """How often one device id may join a broadcast (see the module's docstring)."""

    burst: int = 6
    """Joins at once."""
    per_s: float = 1.0
    """Joins a second after the burst: a puller rejoins after 2 s of silence at the soonest."""
    unacked: int = 3
    """Joins in a row with no ack from the device in between."""
    forgive_s: float = 60.0
    """A device refused for want of acks may join once more after this long (a new pull
    of the same release, a while later)."""
    devices: int = 100_000
    """Device ids remembered (the least recently heard are forgotten)."""


class JoinGate:
    """Whether a join from a device id is taken now; `ack` notes that the device receives."""

    def __init__(self, limits: JoinLimits | None = None) -> None:
        limits = limits or JoinLimits()
        self._rate = TokenBuckets(limits.burst, limits.per_s, limits.devices)
        self._unacked = TokenBuckets(limits.unacked, 1.0 / limits.forgive_s, limits.devices)

    def join(self, device: str, now: float) -> bool:
        """True if the join is taken (and counted); False if it is to be ignored."""
        return self._rate.take(device, now) and self._unacked.take(device, now)

    def ack(self, device: str) -> None:
        """`device` acked a frame it had not acked before: it is receiving, its joins in a
        row start again. The caller says when (`Broadcast.ack`)."""
        self._unacked.forget(device)
