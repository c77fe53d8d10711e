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
    """Pipeline id to the compile report of the model serving it: one model name may run
    on two devices or engines for two pipelines, each with its own latency."""


def serving_report(handle: PipelineHandle, name: str, pool: TrackedPool) -> CompileReport | None:
    """The compile report of the model `name` as it serves `handle`'s pipeline.

    The pipeline's own compile when it is the one named (by name, a model on the CPU for
    one pipeline and on the GPU for another gave both the latest compile's device);
    otherwise, `name` served the latest frame and a swap has moved on since, so the pool's
    latest report of that name.
    """
    label, report = handle.pipeline.serving()
    if label == name:
        return report
    return pool.reports().get(name) or pool.last_report(name)


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
        reports: dict[str, CompileReport] = {}
        now = time.monotonic()
        with self._roster.lock:  # against `run_ended` taking a last interval at the same moment
            for pipeline_id, ended in self._last_intervals.items():
                stats[pipeline_id] = merge_intervals([e.stats for e in ended])
                models[pipeline_id] = ended[-1].model
                report = ended[-1].report
                if report is not None:
                    reports[pipeline_id] = report
            self._last_intervals.clear()
            for entry in self._roster.running.values():
                if entry.handle is None or entry.status != "running" or entry.ended:
                    continue
                if entry.spec.id in stats:
                    continue
                snapshot = entry.handle.telemetry.interval()
                stats[entry.spec.id] = snapshot
                models[entry.spec.id] = serving_model(entry)
                report = serving_report(entry.handle, models[entry.spec.id], self._pool)
                if report is not None:
                    reports[entry.spec.id] = report
                if snapshot.frames > 0:
                    entry.fresh_at = now
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
