"""The pipelines the agent runs: start, stop, and restart after failures.

Each pipeline runs on its own thread around a `PipelineHandle`, sharing one
`ModelPool` so pipelines on the same model share one compiled model. What was
started by command is written to the agent record, so a restart or a reboot
brings the same pipelines back without the fleet resending anything; a stop
by command forgets it.

A live source (camera, stream, microphone) that fails for good is retried
with backoff (5 s doubling to 5 min): cameras come back after power cuts and
the agent must not need a command for it (a run that ends without an error, its
max_frames not reached, is not retried, nor marked finished). A pipeline that did all
that was asked of it, a file played to its end or the max_frames it was given run
whatever its source, is finished, and recorded so: a restart lists it stopped, and does
not run it again; meanwhile it is listed stopped, and holds no slot of max_pipelines.

`Pipelines` is what the rest of the agent calls. Besides the runs it owns, it hands on
to one module per job: the table of pipelines held and their record (`roster.py`), the
checks of a spec (`specs.py`), the restore at the agent's start (`restore.py`), hot swaps
and reloads (`swaps.py`), and telemetry ticks and stale detection (`ticks.py`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from edge_agent.agent.loaded import TrackedPool
from edge_agent.agent.records import AgentRecords
from edge_agent.agent.restore import Restorer
from edge_agent.agent.roster import (
    LIVE,
    RETRY_MAX_S,
    RETRY_MIN_S,
    Roster,
    Running,
    recorded_model,
    serving_model,
    state_of,
)
from edge_agent.agent.sink import AgentSink, EmitEvent, EmitResult, ResultsPolicy
from edge_agent.agent.specs import checked_spec, mend_recorded_mode
from edge_agent.agent.specs import parse_spec as parse_spec  # callers import it from here
from edge_agent.agent.swaps import Swaps
from edge_agent.agent.ticks import Tick, Ticker, serving_report
from edge_agent.errors import EdgeAgentError
from edge_agent.logs import log_crash, log_event
from edge_agent.paths import Layout
from edge_agent.pipelines.runner import PipelineHandle
from edge_agent.pipelines.spec import ModelRef, PipelineSpec
from edge_agent.pipelines.vision import VisionPipeline
from edge_agent.protocol.agent import AgentEvent, PipelineState

log = logging.getLogger(__name__)


_NEVER_PASSES = frozenset(
    {"command.invalid", "config.invalid", "model.incompatible", "model.shape", "path.denied"}
)
"""Codes of a spec this build refuses: its start from the record is not retried."""


class Pipelines:
    """Every pipeline the agent runs. Thread-safe.

    Args:
        pool: Compiled models, shared.
        layout: Where captures live.
        records: Where the running set is persisted.
        policy: Which results to publish.
        emit_result: Queues results.
        emit_event: Queues events.
        max_running: Pipelines held at most, failed ones included (`max_pipelines`).
        protected: Files and folders no pipeline may name, besides the layout's own
            (`Layout.owned`): the files the agent's config names, the reference models.
    """

    def __init__(
        self,
        pool: TrackedPool,
        layout: Layout,
        records: AgentRecords,
        policy: ResultsPolicy,
        emit_result: EmitResult,
        emit_event: EmitEvent,
        *,
        max_running: int,
        protected: Sequence[Path] = (),
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.pool = pool
        self._roster = Roster(records, max_running)
        self.protected = (*layout.owned(), *protected)
        self.layout = layout
        self.policy = policy
        self._emit_result = emit_result
        self._emit_event = emit_event
        self._clock = clock
        self._restorer = Restorer(
            self._roster,
            # From the record: what an earlier build accepted, harmless, is mended.
            lambda data: mend_recorded_mode(
                checked_spec(data, self.layout.state, self.protected, recorded=True),
                self._head_of,
            ),
            self._start_recorded,
            self._event,
        )
        self._swaps = Swaps(self._roster, pool, self._event, self._restart)
        self._ticker = Ticker(self._roster, pool)
        self._closed = threading.Event()
        self._held_starts: list[threading.Thread] = []
        """Threads starting pipelines held over the cap (`start_held`), for `close`."""

    @property
    def records(self) -> AgentRecords:
        """Where the running set is persisted."""
        return self._roster.records

    @property
    def max_running(self) -> int:
        """Pipelines held at most, failed ones included (`max_pipelines`)."""
        return self._roster.max_running

    @max_running.setter
    def max_running(self, value: int) -> None:
        self._roster.max_running = value

    # --- commands ----------------------------------------------------------------------------
    def start(self, data: dict[str, Any], persist: bool = True) -> PipelineState:
        """Build and start a pipeline from a spec; raises if the id runs or the spec is bad."""
        return self._start(self._checked(data), persist)

    def _start(self, spec: PipelineSpec, persist: bool, own_slot: bool = False) -> PipelineState:
        with self._roster.lock:
            entry = self._roster.register(spec, own_slot)
        return self._start_registered(entry, persist)

    def _checked(self, data: dict[str, Any]) -> PipelineSpec:
        return checked_spec(data, self.layout.state, self.protected)

    def _start_registered(self, entry: Running, persist: bool) -> PipelineState:
        spec = entry.spec
        try:
            self._launch(entry)
            if persist:
                # Under the record's lock, against a stop_pipeline that came during the
                # compile: it set `stopping` before it forgets the record, so either it
                # forgets this one after, or this sees it and records nothing.
                with self._roster.record_lock:
                    if entry.stopping.is_set():
                        raise _stopped_while_starting(spec.id)
                    self._record_start(spec)
        except BaseException:
            with self._roster.lock:
                ours = self._roster.running.get(spec.id) is entry
                if ours:
                    del self._roster.running[spec.id]
            if ours and entry.handle is not None:
                # Launched, then refused: it must not run on where no command can reach it.
                entry.stopping.set()
                entry.handle.stop()
                if entry.thread is not None:
                    entry.thread.join(5.0)
            raise
        return state_of(entry)

    def _start_recorded(self, entry: Running) -> PipelineState:
        """Start a pipeline from the record (a restore, a restart after a deploy). A live
        source whose build fails for a reason that may pass is kept, failed, and retried
        as a run that lost its feed is: after a full cache disk or a model briefly gone at
        boot, it was listed failed for good, on every box, until an operator stopped and
        started it again."""
        try:
            return self._start_registered(entry, persist=False)
        except Exception as exc:
            if not self._retry_recorded(entry, exc):
                raise
            return state_of(entry)

    def _retry_recorded(self, entry: Running, exc: Exception) -> bool:
        """Keep `entry` registered, failed, and schedule its retry, if it is live and `exc`
        may pass; False (nothing done) otherwise."""
        spec = entry.spec
        code = exc.code if isinstance(exc, EdgeAgentError) else "internal"
        if spec.source.type not in LIVE or code in _NEVER_PASSES or self._closed.is_set():
            return False
        with self._roster.record_lock, self._roster.lock:
            # Not one a stop_pipeline forgot or a start_pipeline took meanwhile.
            roster = self._roster
            if (
                entry.stopping.is_set()
                or spec.id not in self.records.record.pipelines
                or spec.id in roster.running
                or (
                    spec.id not in roster.restarting
                    and roster.slots_taken(spec.id) >= roster.max_running
                )
            ):
                return False
            roster.running[spec.id] = entry
        entry.status, entry.detail = "failed", f"start from its record failed, retried: {exc}"
        entry.failed_code = code
        self._restorer.failed(spec.id, exc, entry.detail)
        self._schedule_retry(entry)
        return True

    def _record_start(self, spec: PipelineSpec) -> None:
        try:
            self._roster.persist_locked(spec.id, spec)
        except OSError as exc:
            # A full or read-only state disk: the pipeline runs and is listed, it just
            # will not come back by itself after a restart. Said, not fatal.
            log_event(
                log,
                logging.ERROR,
                "pipeline_not_recorded",
                pipeline=spec.id,
                error=str(exc),
                fix="free space on the state disk; the pipeline is not restored after a restart",
            )

    def _launch(self, entry: Running, retry: bool = False) -> None:
        spec = entry.spec
        sink = AgentSink(
            spec.id,
            self.policy,
            self._emit_result,
            self._emit_event,
            self._clock,
            outage=entry.outage,
        )
        with self._roster.lock:
            entry.reload = False  # this build resolves the model afresh
        # Building compiles the model: on the command's thread, so its errors answer it.
        on_live = entry.outage.live if entry.outage is not None else None
        handle = PipelineHandle(spec, self.pool, [sink], layout=self.layout, on_live=on_live)
        with self._roster.lock:
            # A stop_pipeline during the compile found no handle to stop: this one must
            # not run (stop sets `stopping` under this lock).
            stopped = entry.stopping.is_set()
            if not stopped:
                entry.handle, entry.sink, entry.ended = handle, sink, False
                # A retry's entry still held its last run's thread, dead: until the new one
                # is started below, `stale` would read the running pipeline as wedged.
                entry.thread = None
            reload = entry.reload
        if stopped:
            handle.close()
            raise _stopped_while_starting(spec.id)
        entry.status, entry.detail = "running", ""
        entry.fresh_at = time.monotonic()
        thread = threading.Thread(
            target=self._run, args=(entry, handle), name=f"pipeline-{spec.id}", daemon=True
        )
        thread.start()
        entry.thread = thread  # only once started: stop() may join it at any moment
        detail = f"model {spec.model.name}"
        if retry:
            # A retry said only "model ...", as a start by command does: a console could not
            # tell the camera's tenth retry from a new start.
            detail = f"retry {entry.retries} after {entry.failed_code}, {detail}"
        self._event("pipeline_started", spec.id, detail=detail)
        if reload and isinstance(handle.pipeline, VisionPipeline):
            # A deploy, activate or rollback of its model during the build found no handle
            # to swap; left alone, this kept the version it had resolved for good.
            self._swaps.swap_to(entry, handle, None)
        elif reload:
            # An audio pipeline is not swapped but restarted (its model's state runs with
            # it), as `Swaps.reload_model` restarts a running one; on a thread, as its
            # restart compiles again.
            threading.Thread(
                target=self._restart, args=(entry,), name=f"restart-{spec.id}", daemon=True
            ).start()

    def _run(self, entry: Running, handle: PipelineHandle) -> None:
        spec = entry.spec
        crashed: str | None = None
        try:
            handle.run()
        except Exception as exc:  # a bug in one pipeline must not take the agent down
            log_crash(log, "pipeline_crashed", pipeline=spec.id)
            crashed = f"crashed: {exc}"
        finally:
            with self._roster.lock:
                # The model that served, and its report, before close() gives the model
                # back to the pool (which then forgets the report); under the lock `tick`
                # reads the pool under, so a run `tick` finds not ended holds its model.
                entry.ended = True
                model = serving_model(entry)
                report = serving_report(handle, model, self.pool)
            handle.close()
        self._ticker.run_ended(spec.id, handle, model, report)
        error = handle.pipeline.error
        with self._roster.lock:
            if entry.handle is handle:
                # The run is over, and the entry stays until a stop_pipeline (a file played
                # out, a failure): its frame buffers, histograms and sinks need not stay
                # with it. A retry builds a new handle.
                entry.handle, entry.sink = None, None
        if entry.stopping.is_set():
            entry.status = "stopped"
            return
        if crashed is not None:
            # Said like any other failure, so the console hears the pipeline is gone.
            entry.status, entry.detail = "failed", crashed
            self._event("pipeline_failed", spec.id, code="internal", detail=crashed)
            if spec.source.type in LIVE:
                # As a crash in a retry is retried: a one-off bug ended the camera for good.
                entry.failed_code = "internal"
                self._schedule_retry(entry)
        elif error is not None:
            entry.status, entry.detail = "failed", str(error)
            self._event("pipeline_failed", spec.id, code=error.code, detail=str(error))
            if spec.source.type in LIVE:
                if handle.telemetry.snapshot().frames:
                    # This run worked before it lost its feed: retries start again from the
                    # shortest wait. Left doubled, a camera's every outage after its first
                    # few would wait the full 5 minutes before the first retry.
                    entry.retry_s, entry.retries = RETRY_MIN_S, 0
                entry.failed_code = error.code
                self._schedule_retry(entry)
        else:
            # Finished: a file that played out, or any source that gave the max_frames
            # asked of it. A live source that went away ends with an error, and is retried
            # above; one that ends cleanly short of its max_frames (its source closed under
            # the run) is not finished either, and runs again after a restart, as it did.
            finished = spec.source.type not in LIVE or handle.pipeline.completed
            with self._roster.lock:
                entry.status, entry.detail = "stopped", "source ended"
                # Under the lock `slots_taken` counts under: its slot is free from here.
                entry.finished = finished
            if finished:
                self._record_finished(entry)
            self._event("pipeline_stopped", spec.id, detail="source ended")
            if finished:
                # As a stop_pipeline's does: a pipeline held over the cap takes the room.
                self._room_made()

    def _record_finished(self, entry: Running) -> None:
        """Mark a recorded pipeline finished, before the event says so: a restart lists it
        stopped and does not run it again. Recorded as one to run, every restart or reboot
        played the file again (or ran a camera's max_frames again) and sent all its results
        upstream once more. A run cut short (a crash, kill -9, a power cut, the agent's own
        stop, a camera lost) leaves no mark, and runs again: it never sent all it had to."""
        spec = entry.spec
        roster = self._roster
        try:
            # Under the record's lock, as stop forgets one: a stop_pipeline that came as
            # the run ended either forgets the mark with the record, or is seen here.
            with roster.record_lock:
                with roster.lock:
                    ours = roster.running.get(spec.id) is entry and not entry.stopping.is_set()
                if ours:
                    roster.finished_locked(spec.id, self._clock())
        except OSError as exc:
            # A full or read-only state disk: it is listed stopped all the same; only a
            # restart does not know it finished.
            log_event(
                log,
                logging.ERROR,
                "pipeline_end_not_recorded",
                pipeline=spec.id,
                error=str(exc),
                fix="free space on the state disk; the pipeline runs again from its start "
                "after a restart (plays its file again, or its max_frames)",
            )

    def _schedule_retry(self, entry: Running) -> None:
        delay = entry.retry_s
        entry.retry_s = min(RETRY_MAX_S, entry.retry_s * 2)
        log_event(log, logging.INFO, "pipeline_retry", pipeline=entry.spec.id, delay_s=delay)

        def retry() -> None:
            if entry.stopping.wait(delay) or self._closed.is_set():
                return
            entry.retries += 1
            try:
                self._launch(entry, retry=True)
            except EdgeAgentError as exc:
                if entry.stopping.is_set():
                    return  # stopped while it relaunched: no more retries
                entry.status, entry.detail = "failed", str(exc)
                entry.failed_code = exc.code
                self._schedule_retry(entry)
            except Exception as exc:  # a bug must not end a live camera's retries for good
                log_crash(log, "pipeline_retry_crashed", pipeline=entry.spec.id)
                entry.status, entry.detail = "failed", f"crashed: {exc}"
                entry.failed_code = "internal"
                self._schedule_retry(entry)

        threading.Thread(target=retry, name=f"retry-{entry.spec.id}", daemon=True).start()

    def stop(self, pipeline_id: str, forget: bool = True, timeout: float = 5.0) -> PipelineState:
        """Stop a pipeline (within `timeout`) and, by default, forget it across restarts."""
        recorded = None
        unwritable: OSError | None = None
        # Taken out of the running and forgotten in one step, under the record's lock: a
        # restore starts a recorded pipeline only if it is still recorded and not running,
        # under that lock, so one stopped here is never started again behind this stop
        # (forgotten after the join instead, a restore in the join's 5 s started it,
        # unrecorded, and the stop was answered stopped).
        with self._roster.record_lock:
            with self._roster.lock:
                entry = self._roster.running.pop(pipeline_id, None)
                if entry is not None:
                    entry.stopping.set()
                # Between a deploy's restart's stop and its start again (`_restart`) the
                # pipeline is in no table: the restart is told, and starts nothing.
                restarting = self._roster.restarting.get(pipeline_id) if forget else None
                if entry is None and restarting is not None:
                    self._roster.restart_stopped.add(pipeline_id)
            if forget:
                recorded = self.records.record.pipelines.get(pipeline_id)
                if recorded is not None:
                    try:
                        self._roster.persist_locked(pipeline_id, None)
                    except OSError as exc:
                        unwritable = exc  # still recorded: still listed, if it was
                    else:
                        with self._roster.lock:
                            self._roster.unrestored.pop(pipeline_id, None)
        if entry is None:
            if restarting is not None:
                # It ran until its restart stopped it, and now will not run again: stopped,
                # by this command, and its slot freed once the restart lets it go.
                self._event("pipeline_stopped", pipeline_id, detail="stopped by command")
                if unwritable is not None:
                    raise _not_forgotten(pipeline_id, unwritable, stopped=True)
                return PipelineState(id=pipeline_id, model=restarting, status="stopped")
            # Recorded, not running: its restore failed (a model since removed, a spec this
            # version refuses), or is yet to come. Not found, it was tried and refused at
            # every start with no command able to remove it.
            if unwritable is not None:
                raise _not_forgotten(pipeline_id, unwritable, stopped=False)
            if recorded is not None:
                self._event("pipeline_stopped", pipeline_id, detail="forgotten: not running")
                model = recorded_model(recorded)
                return PipelineState(id=pipeline_id, model=model, status="stopped")
            raise EdgeAgentError(
                f"no pipeline {pipeline_id!r}",
                "list them with list_pipelines",
                code="pipeline.not_found",
            )
        if entry.handle is not None:
            entry.handle.stop()
        if entry.thread is not None:
            entry.thread.join(timeout)
        entry.status = "stopped"
        if forget:
            # Said whether or not the disk let it be forgotten: it has stopped.
            self._event("pipeline_stopped", pipeline_id, detail="stopped by command")
            self._room_made()
            if unwritable is not None:
                raise _not_forgotten(pipeline_id, unwritable, stopped=True)
        return state_of(entry)

    def _room_made(self) -> None:
        """A slot is free: a pipeline held over the cap takes it. On a thread of its own,
        as its compile would hold the caller (a command's answer, a deploy's, a run's end)."""
        thread = threading.Thread(target=self.start_held, name="start-held", daemon=True)
        with self._roster.lock:
            if self._closed.is_set():
                return
            self._held_starts = [t for t in self._held_starts if t.is_alive()]
            self._held_starts.append(thread)
            # Started under the lock `close` lists them under: a caller on another thread
            # than the agent's stop (a restart's end, a run that finished) could add it just
            # before `close` listed it, and `close` joining a thread not yet started raised
            # RuntimeError. The thread waits for the lock, not this.
            thread.start()

    def swap(self, pipeline_id: str, ref: dict[str, Any]) -> PipelineState:
        """Hot-swap the model of a running pipeline; the swap compiles in the background."""
        return self._swaps.swap(pipeline_id, ref)

    def refs_of(self, name: str) -> list[ModelRef]:
        """How each pipeline held on model `name` runs it (engine, device, ...), as its
        record says (a swap included): what a new version of `name` must run on."""
        with self._roster.lock:
            entries = list(self._roster.running.values())
        return [e.spec.model for e in entries if e.spec.model.name == name]

    def reload_model(self, name: str) -> list[str]:
        """Move every pipeline on model `name` to what the catalog now resolves; never
        raises for one pipeline (`Swaps.reload_model`). Returns those running or starting
        on it."""
        return self._swaps.reload_model(name)

    def _restart(self, entry: Running) -> bool:
        """Stop a pipeline and start it again from its spec (its record untouched); a
        failure is said as the pipeline's, never raised (the store has changed).

        It keeps its slot throughout: reserved before the stop, so no start_pipeline takes
        it during the join, and started again whatever the count. Counted like a new one,
        a deploy stopped an audio pipeline for good whenever pipelines held over the cap
        (`restore`) filled it: the restart held the very pipeline it had stopped.

        A stop_pipeline that comes meanwhile wins, and is no failure: the pipeline is not
        started again behind it (`Roster.restart_stopped`), and no `pipeline_failed` says
        that the restart failed, as it once did for a stop during the compile.
        """
        pipeline_id = entry.spec.id
        spec = entry.spec.model_dump(mode="json")
        recorded = pipeline_id in self.records.record.pipelines
        with self._roster.lock:
            self._roster.restarting[pipeline_id] = entry.spec.model.name
        try:
            self.stop(pipeline_id, forget=False)
            if recorded:
                # Only if still recorded, and not stopped meanwhile, as a restore does: a
                # stop_pipeline that came during this stop's join found it not running.
                restored = self._restorer.restore_one(pipeline_id, spec, own_slot=True)
                return restored in ("started", "running")
            # `Roster.register` refuses it if a stop_pipeline came meanwhile.
            self._start(self._checked(spec), persist=False, own_slot=True)
        except EdgeAgentError as exc:
            if exc.code in ("command.cancelled", "pipeline.not_found"):
                # A stop_pipeline came first (not found by this stop), or while it was
                # started again: the operator's own stop, answered stopped and said so.
                log_event(
                    log,
                    logging.INFO,
                    "pipeline_not_restarted",
                    pipeline=pipeline_id,
                    detail="stopped by a stop_pipeline while it restarted",
                )
                return False
            detail = f"restart on the new model failed: {exc}"
            self._event("pipeline_failed", pipeline_id, code=exc.code, detail=detail)
            return False
        except Exception as exc:  # a sink's OSError, a bug: this pipeline's, not the deploy's
            log_crash(log, "pipeline_restart_crashed", pipeline=pipeline_id)
            self._event("pipeline_failed", pipeline_id, code="internal", detail=str(exc))
            return False
        finally:
            with self._roster.lock:
                self._roster.restarting.pop(pipeline_id, None)
                self._roster.restart_stopped.discard(pipeline_id)
                # Not started again (listed unrestored, or stopped meanwhile): its slot is
                # free, and only a stop_pipeline started those held over the cap.
                freed = pipeline_id not in self._roster.running
            if freed:
                self._room_made()
        return True

    def _head_of(self, model: str) -> str | None:
        """The head type of `model` as the catalog resolves it now, or None if it cannot."""
        try:
            return self.pool.catalog.resolve(model).manifest.head.type
        except Exception:  # the build says what is wrong with the model
            return None

    def start_held(self) -> list[str]:
        """Start pipelines held over the cap while there is room (`Restorer.start_held`);
        failures are reported, not raised."""
        try:
            return self._restorer.start_held(self._closed.is_set)
        except Exception:  # on its own thread: said, never raised into nothing
            log_crash(log, "start_held_failed")
            return []

    def restore(self) -> list[str]:
        """Start every pipeline the record holds, returning those that run as it says;
        failures are reported, not raised, and those over `max_running` held
        (`Restorer.restore`)."""
        return self._restorer.restore()

    # --- reading -----------------------------------------------------------------------------
    def states(self) -> list[PipelineState]:
        return self._roster.states()

    def handles(self) -> dict[str, PipelineHandle]:
        """The running pipelines' handles, for telemetry."""
        return self._roster.handles()

    def tick(self) -> Tick:
        """Each pipeline's figures since the last call, the models behind them, and
        heartbeat bookkeeping (`Ticker.tick`)."""
        return self._ticker.tick()

    def stale(self, max_age_s: float) -> list[str]:
        """Running pipelines that look wedged (`Ticker.stale`)."""
        return self._ticker.stale(max_age_s)

    def fps(self) -> float:
        """Total recent FPS over every running pipeline, for systemd's STATUS=."""
        return sum(h.telemetry.snapshot().fps_recent for h in self.handles().values())

    def _event(self, kind: str, pipeline: str, code: str | None = None, detail: str = "") -> None:
        self._emit_event(
            AgentEvent.model_validate(
                {
                    "kind": kind,
                    "ts": self._clock(),
                    "pipeline": pipeline,
                    "code": code,
                    "detail": detail,
                }
            )
        )

    def close(self, timeout: float = 5.0) -> None:
        """Stop every pipeline (remembered for the next start) within about `timeout`."""
        self._closed.set()
        deadline = time.monotonic() + timeout
        # A held pipeline being started after a stop: in the running once started, and
        # then stopped below with the rest (none is left running behind a close).
        with self._roster.lock:
            starts = list(self._held_starts)
        for thread in starts:
            thread.join(max(0.1, deadline - time.monotonic()))
        with self._roster.lock:
            ids = list(self._roster.running)
        for pipeline_id in ids:
            left = max(0.1, deadline - time.monotonic())
            with contextlib.suppress(EdgeAgentError):
                self.stop(pipeline_id, forget=False, timeout=left)


def _stopped_while_starting(pipeline_id: str) -> EdgeAgentError:
    return EdgeAgentError(
        f"pipeline {pipeline_id} was stopped while it started",
        "start it again if it should run",
        code="command.cancelled",
    )


def _not_forgotten(pipeline_id: str, exc: OSError, *, stopped: bool) -> EdgeAgentError:
    """A stop_pipeline the state disk would not record (full, read-only): logged, and
    answered with what happened and what did not, for the record still names the pipeline
    and a restart brings it back. A stop_pipeline sent again forgets it, not running."""
    log_event(log, logging.ERROR, "pipeline_not_forgotten", pipeline=pipeline_id, error=str(exc))
    done = "stopped, but" if stopped else "is not running, and"
    return EdgeAgentError(
        f"pipeline {pipeline_id} {done} the state disk cannot record it forgotten "
        f"({exc.strerror or exc}): it starts again at the next restart",
        "free space on the state disk, then send stop_pipeline for it again",
        code="path.unwritable",
    )
