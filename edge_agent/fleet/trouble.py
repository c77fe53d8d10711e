"""What is wrong with a device, as short flags an operator reads at a glance.

An offline box or a failed pipeline is plain from the state. These are not: a camera
that died behind a running pipeline (FPS 0.0), frames dropped, an outbox throwing
messages away, a box that trusts no key, a model that fell back to another device, a
clock far off, and figures replayed from an outage. Each is read from fields the
console already receives; `watch` puts the flagged first and `status` shows the
device's flags. Pure: records in, strings out.
"""

from __future__ import annotations

from edge_agent.fleet import clock
from edge_agent.fleet.roster import DeviceRecord

REPLAY_MIN_S = 60.0
"""Telemetry this far behind the box's state (and two intervals) is a replayed backlog,
not the last interval running late."""


def pipeline_flags(record: DeviceRecord) -> dict[str, list[str]]:
    """Each pipeline's flags, from its last interval: `fps0` (running, no frame) and
    `drops N%` (frames dropped, as a share of the frames it had)."""
    status = {p.id: p.status for p in record.state.pipelines} if record.state else {}
    found: dict[str, list[str]] = {}
    for name, stats in record.telemetry.pipelines.items() if record.telemetry else []:
        flags = found.setdefault(name, [])
        # A pipeline still starting has no frame yet: only a running one is dead at 0.
        if stats.fps == 0.0 and status.get(name, "running") == "running":
            flags.append("fps0")
        if stats.dropped_frames > 0:
            share = stats.dropped_frames / (stats.frames + stats.dropped_frames)
            flags.append(f"drops {share:.0%}")
    return found


def device_flags(record: DeviceRecord) -> list[str]:
    """The device's own flags: `clock ±N`, `replaying Nm behind`, `outbox-drops`,
    `unverified`, `fallback`."""
    flags: list[str] = []
    if clock.off(record.skew_s) and record.skew_s is not None:
        flags.append(f"clock {clock.span(record.skew_s)}")
    behind = replay_lag(record)
    if behind is not None:
        flags.append(f"replaying {clock.span(behind)[1:]} behind")
    telemetry = record.telemetry
    before = record.outbox_dropped_before
    if telemetry is not None and before is not None and telemetry.agent.outbox_dropped > before:
        flags.append("outbox-drops")
    if record.state is not None:
        if record.state.unverified:
            flags.append("unverified")
        if any(m.fallback for m in record.state.models):
            flags.append("fallback")
    return flags


def replay_lag(record: DeviceRecord) -> float | None:
    """How far the newest telemetry is behind the box's state, when it is a backlog.

    Both times are the box's own clock, so a skew does not matter: a birth made at the
    reconnect followed by telemetry made before it is the outbox replaying the outage.
    """
    state, telemetry = record.state, record.telemetry
    if state is None or telemetry is None or not state.online:
        return None
    behind = state.ts - telemetry.ts
    if behind > max(REPLAY_MIN_S, 2 * telemetry.interval_s):
        return behind
    return None


def all_flags(record: DeviceRecord) -> list[str]:
    """Every flag of the device, its pipelines' named `<pipeline>: <flag>`."""
    flags = device_flags(record)
    for name, found in pipeline_flags(record).items():
        flags += [f"{name}: {flag}" for flag in found]
    return flags


def in_trouble(record: DeviceRecord) -> bool:
    """Offline, a pipeline that is not running, or any flag: what an operator looks for first."""
    if not record.online:
        return True
    state = record.state
    if state is not None and any(p.status != "running" for p in state.pipelines):
        return True
    return bool(all_flags(record))
