"""What is wrong with a device, as short flags an operator reads at a glance.

An offline box or a failed pipeline is plain from the state. These are not: a camera
that died behind a running pipeline (FPS 0.0), frames dropped, an outbox throwing
messages away, a box that trusts no key, a model that fell back to another device, a
clock far off, and figures replayed from an outage. Each is read from fields the
console already receives; `watch` puts the flagged first and `status` shows the
device's flags. Pure: records in, strings out.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable

from edge_agent.fleet import clock
from edge_agent.fleet.roster import DeviceRecord

CPU_FULL = 0.9
"""The share of its CPUs past which the agent is flagged `cpu N%`: the box takes no more."""
SILENT_MIN_S = 60.0
SILENT_INTERVALS = 3
"""An online box heard live, then not for this many telemetry intervals (at least
SILENT_MIN_S, or what `watch --silent-after` says), is flagged `silent`: its will comes
when the broker notices a lost link, but
not when the broker itself restarted without its sessions, or the console's own link is
down, and a watch showed such boxes green with their last FPS for hours."""
UNCONFIRMED = "unconfirmed since reconnect"
"""The flag of a device whose state the broker did not send again when this console's own
link came back (`DeviceRecord.stale_since`): gone from the broker, so maybe from the fleet."""
REPLAY_MIN_S = 60.0
"""Telemetry this far behind the box's state (and two intervals) is a replayed backlog,
not the last interval running late."""


def pipeline_flags(record: DeviceRecord) -> dict[str, list[str]]:
    """Each pipeline's flags, from its last interval: `fps0` (running, no frame) and
    `drops N%` (frames dropped, as a share of the frames it had; shown, but not trouble:
    see `in_trouble`)."""
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


def device_flags(
    record: DeviceRecord, now: float | None = None, *, silent_min_s: float = SILENT_MIN_S
) -> list[str]:
    """The device's own flags: `unconfirmed since reconnect`, `silent Nm`, `clock ±N`,
    `replaying Nm behind`, `outbox-drops`, `unverified`, `fallback`, and `cpu N%` (a note,
    see `in_trouble`). `now` is the console's clock (default: now); `silent_min_s` as in
    `silent_at`."""
    flags: list[str] = []
    if record.unknown:
        # First: the state and figures beside it are the last known, not the current ones.
        flags.append(UNCONFIRMED)
    quiet = silent_for(record, time.time() if now is None else now, silent_min_s)
    if quiet is not None:
        flags.append(f"silent {clock.span(quiet)[1:]}")
    if clock.off(record.skew_s) and record.skew_s is not None:
        flags.append(f"clock {clock.span(record.skew_s)}")
    behind = replay_lag(record)
    if behind is not None:
        flags.append(f"replaying {clock.span(behind)[1:]} behind")
    telemetry = record.telemetry
    before = record.outbox_dropped_before
    if telemetry is not None and before is not None and telemetry.agent.outbox_dropped > before:
        flags.append("outbox-drops")
    if telemetry is not None and telemetry.agent.cpu_cores:
        # Beside each pipeline's `drops N%`, it says why: more cameras than the box's
        # cores take (18 on a 2-core box: every pipeline dropped 41-48%, and nothing said
        # the CPU was full), or a camera faster than its model on a box with none to spare.
        share = telemetry.agent.cpu_percent / (100.0 * telemetry.agent.cpu_cores)
        if share >= CPU_FULL:
            flags.append(f"cpu {share:.0%}")
    if record.state is not None:
        if record.state.unverified:
            flags.append("unverified")
        if any(m.fallback for m in record.state.models):
            flags.append("fallback")
    return flags


def silent_at(record: DeviceRecord, silent_min_s: float = SILENT_MIN_S) -> float | None:
    """The console time past which an online box heard live reads silent, unless a message
    of it arrives first: its telemetry's due, SILENT_INTERVALS intervals after the last
    one heard, and at least `silent_min_s` (an operator's `watch --silent-after`). None
    when it is not judged: offline says it already, and retained-only boxes (`status`)
    were never heard live."""
    heard, telemetry = record.last_heard, record.telemetry
    if not record.online or heard is None or telemetry is None or record.telemetry_arrived is None:
        return None
    return heard + max(silent_min_s, SILENT_INTERVALS * telemetry.interval_s)


def silent_for(
    record: DeviceRecord, now: float, silent_min_s: float = SILENT_MIN_S
) -> float | None:
    """How long a box silent at `now` (see `silent_at`) has said nothing; None if it is
    not silent."""
    since, heard = silent_at(record, silent_min_s), record.last_heard
    if since is None or heard is None or now <= since:
        return None
    return now - heard


def next_silence(
    records: Iterable[DeviceRecord], now: float, silent_min_s: float = SILENT_MIN_S
) -> float | None:
    """When the first of `records` not silent at `now` turns silent if nothing of it comes
    meanwhile; None if none can. Silence is the one flag that time alone sets (a message
    clears it, and says so itself), so a piped watch, which prints at a change, looks
    again then rather than at every tick."""
    return min(
        (t for t in (silent_at(r, silent_min_s) for r in records) if t is not None and t >= now),
        default=None,
    )


def replay_lag(record: DeviceRecord) -> float | None:
    """How far the newest telemetry is behind the box's state, when it is a backlog.

    Both times are the box's own clock, so a skew does not matter: a birth made at the
    reconnect followed by telemetry made before it is the outbox replaying the outage.
    """
    state, telemetry = record.state, record.telemetry
    if state is None or telemetry is None or not state.online:
        return None
    state_at, telemetry_at = record.state_arrived, record.telemetry_arrived
    if state_at is not None and telemetry_at is not None and telemetry_at < state_at:
        # The telemetry held is from before this birth arrived (a restart while watched):
        # not a backlog until telemetry made before the birth comes after it.
        return None
    behind = state.ts - telemetry.ts
    if math.isfinite(behind) and behind > max(REPLAY_MIN_S, 2 * telemetry.interval_s):
        return behind
    return None


def all_flags(
    record: DeviceRecord, now: float | None = None, *, silent_min_s: float = SILENT_MIN_S
) -> list[str]:
    """Every flag of the device, its pipelines' named `<pipeline>: <flag>`."""
    flags = device_flags(record, now, silent_min_s=silent_min_s)
    for name, found in pipeline_flags(record).items():
        flags += [f"{name}: {flag}" for flag in found]
    return flags


def in_trouble(
    record: DeviceRecord, now: float | None = None, *, silent_min_s: float = SILENT_MIN_S
) -> bool:
    """Offline, a pipeline that is not running, or any flag but `drops` and `cpu`: what an
    operator looks for first.

    Dropped frames are a live source working as designed whenever the camera is faster
    than the model (the newest frame replaces one not yet taken): counted as trouble,
    every box with a 25 FPS camera on a 10 FPS model sorted first as failing. A pipeline
    with no FPS cap takes every core it can, so a full CPU is that design too.
    """
    if not record.online:
        return True
    state = record.state
    if state is not None and any(p.status != "running" for p in state.pipelines):
        return True
    return any(not _note(flag) for flag in all_flags(record, now, silent_min_s=silent_min_s))


def trouble_kinds(
    record: DeviceRecord, now: float | None = None, *, silent_min_s: float = SILENT_MIN_S
) -> frozenset[str]:
    """The device's trouble flags without their figures: `silent`, `clock`, `fps0`,
    `outbox-drops`, `<pipeline>: fps0`, ... (a flag's first word names it; what follows
    moves every interval: `silent 2m`, `clock +41s`). Notes (`drops`, `cpu`) are left out.

    What a piped watch prints a device again for: a box in trouble for one reason that
    gains a second (its camera dies behind an outbox already dropping) was not printed
    again, since it was in trouble before and after, and the log's reader never saw it.
    """
    kinds: set[str] = set()
    for flag in all_flags(record, now, silent_min_s=silent_min_s):
        if _note(flag):
            continue
        where, what = _parts(flag)
        kind = what.split(" ", 1)[0]
        kinds.add(f"{where}: {kind}" if where else kind)
    return frozenset(kinds)


def _note(flag: str) -> bool:
    """A flag shown for what it says, not one that makes a device trouble."""
    return _parts(flag)[1].startswith(("drops ", "cpu "))


def _parts(flag: str) -> tuple[str, str]:
    """A flag as `all_flags` names it, split: (its pipeline, the flag), or ('', the flag)
    for one of the device's own."""
    where, sep, what = flag.partition(": ")
    return (where, what) if sep else ("", flag)
