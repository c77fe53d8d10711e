"""What the pipelines did since the last telemetry tick, and which look wedged.

Each tick takes every running pipeline's interval, and the last interval of every
run that ended since (kept by `run_ended`), with the model that served it and its
compile report. The frames a tick sees also tell `stale` which pipelines still
make frames.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from edge_agent.agent.loaded import TrackedPool
from edge_agent.agent.roster import LIVE, Roster, serving_model
from edge_agent.pipelines.runner import PipelineHandle
from edge_agent.runtime.base import CompileReport
from edge_agent.telemetry.stats import PipelineStats, merge_intervals


@dataclass(frozen=True, slots=True)
class _Ended:
    """A run's last interval, with the model that served it, taken before the run let go
    of the model (afterwards the pool no longer knows the model's compile report)."""

    stats: PipelineStats
    model: str
    report: CompileReport | None


@dataclass(frozen=True, slots=True)
class Tick:
    """One telemetry interval: what each pipeline did, and the models that did it."""

    stats: dict[str, PipelineStats]
    models: dict[str, str]
    """Pipeline id to the model serving it (for an ended run: the one that served last)."""
    reports: dict[str, CompileReport]
    """Model name to its compile report."""


class Ticker:
    """Telemetry intervals and heartbeat bookkeeping over the roster's pipelines.

    Args:
        roster: The pipelines held; its `lock` guards the last intervals too.
        pool: Compiled models, shared: the compile reports of those that serve.
    """

    def __init__(self, roster: Roster, pool: TrackedPool) -> None:
        self._roster = roster
        self._pool = pool
        # Last intervals of runs that ended, oldest first per pipeline, for the next ticks.
        self._last_intervals: dict[str, list[_Ended]] = {}

    def run_ended(
        self, pipeline_id: str, handle: PipelineHandle, model: str, report: CompileReport | None
    ) -> None:
        """Keep the last interval of a run that has ended and closed, for the next tick.

        Args:
            pipeline_id: The pipeline whose run it was.
            handle: The run's handle, closed.
            model: The model that served the run last, read before it closed.
            report: That model's compile report, read before it closed.
        """
        with self._roster.lock:
            # What the run did since the last telemetry tick (closing included): a file that
            # plays out between two ticks, or a camera that fails, would otherwise never be
            # reported at all. A tick meanwhile leaves it out; the next one has all of it.
            last = _Ended(handle.telemetry.interval(), model, report)
            self._last_intervals.setdefault(pipeline_id, []).append(last)

    def tick(self) -> Tick:
        """Each pipeline's figures since the last call, the models behind them, and
        heartbeat bookkeeping.

        A pipeline whose run ended since is reported once more, with its last interval and
        the model that served it. Several runs of one id that ended since (a camera retried
        every few seconds under an hour's telemetry interval) are reported together, merged
        (`merge_intervals`): one a tick let them queue without bound and report ever later.
        When a run ended and another started, the ended ones are reported and the new one's
        interval simply runs on to the next call, so no frame goes unreported and none is
        reported twice.
        """
        stats: dict[str, PipelineStats] = {}
        models: dict[str, str] = {}
        ended_reports: dict[str, CompileReport] = {}
        now = time.monotonic()
        with self._roster.lock:  # against `run_ended` taking a last interval at the same moment
            held = self._pool.reports()  # every run not yet ended holds its model
            for pipeline_id, ended in self._last_intervals.items():
                stats[pipeline_id] = merge_intervals([e.stats for e in ended])
                models[pipeline_id] = ended[-1].model
                for run in ended:
                    if run.report is not None:
                        ended_reports[run.model] = run.report
            self._last_intervals.clear()
            for entry in self._roster.running.values():
                if entry.handle is None or entry.status != "running" or entry.ended:
                    continue
                if entry.spec.id in stats:
                    continue
                snapshot = entry.handle.telemetry.interval()
                stats[entry.spec.id] = snapshot
                models[entry.spec.id] = serving_model(entry)
                if snapshot.frames > 0:
                    entry.fresh_at = now
        # What serves now wins over what served a run that has ended.
        reports = {**ended_reports, **held}
        for name in set(models.values()) - reports.keys():
            # The model of a pipeline's latest frame, retired by a swap since (the next
            # frame, from the new model, is not out yet): what it ran on is still known.
            retired = self._pool.last_report(name)
            if retired is not None:
                reports[name] = retired
        return Tick(stats, models, reports)

    def stale(self, max_age_s: float) -> list[str]:
        """Running pipelines that look wedged: the thread died, or a file source made no
        frame for `max_age_s`. A live source that waits for its camera is not wedged (it
        gives up by its own bounds and is retried), so only its thread is checked."""
        now = time.monotonic()
        with self._roster.lock:
            entries = list(self._roster.running.values())
        found = []
        for entry in entries:
            if entry.status != "running" or entry.thread is None:
                # No thread yet: `_launch` sets it running before it starts the thread,
                # which takes a while on a busy box, and a starting pipeline read as a
                # dead one had the watchdog withheld.
                continue
            alive = entry.thread.is_alive()
            frames = entry.handle.telemetry.snapshot().frames if entry.handle else 0
            if frames != entry.frames_seen:
                entry.frames_seen, entry.fresh_at = frames, now
            idle = now - entry.fresh_at > max_age_s and entry.spec.source.type not in LIVE
            if not alive or idle:
                found.append(entry.spec.id)
        return found
