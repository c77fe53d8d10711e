"""The pipelines the agent runs: start, stop, swap, restore, and restart after failures.

Each pipeline runs on its own thread around a `PipelineHandle`, sharing one
`ModelPool` so pipelines on the same model share one compiled model. What was
started by command is written to the agent record, so a restart or a reboot
brings the same pipelines back without the fleet resending anything; a stop
by command forgets it.

A live source (camera, stream, microphone) that fails for good is retried
with backoff (5 s doubling to 5 min): cameras come back after power cuts and
the agent must not need a command for it. A file source that ends is done.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from edge_agent.agent.loaded import TrackedPool
from edge_agent.agent.outage import SourceOutage
from edge_agent.agent.records import AgentRecords
from edge_agent.agent.sink import AgentSink, EmitEvent, EmitResult, ResultsPolicy
from edge_agent.catalog.manifest import ImageInput
from edge_agent.config_files import drop_unknown_fields, first_error
from edge_agent.errors import EdgeAgentError
from edge_agent.logs import log_crash, log_event
from edge_agent.paths import Layout
from edge_agent.pipelines.confine import confine_writes, refuse_protected
from edge_agent.pipelines.runner import PipelineHandle
from edge_agent.pipelines.spec import ModelRef, PipelineSpec
from edge_agent.pipelines.vision import VisionPipeline
from edge_agent.protocol.agent import AgentEvent, PipelineState
from edge_agent.runtime.base import CompileReport
from edge_agent.runtime.devices import parse_request
from edge_agent.telemetry.stats import PipelineStats, merge_intervals

log = logging.getLogger(__name__)

_LIVE = {"camera", "stream", "mic"}
_RETRY_MIN_S, _RETRY_MAX_S = 5.0, 300.0


@dataclass
class _Running:
    spec: PipelineSpec
    status: str = "starting"
    detail: str = ""
    handle: PipelineHandle | None = None
    sink: AgentSink | None = None
    thread: threading.Thread | None = None
    stopping: threading.Event = field(default_factory=threading.Event)
    frames_seen: int = 0
    fresh_at: float = field(default_factory=time.monotonic)
    retry_s: float = _RETRY_MIN_S
    retries: int = 0
    """Retries since the pipeline last ran with frames; said in each retry's start event."""
    failed_code: str = ""
    """The code of the failure the next retry follows."""
    outage: SourceOutage | None = None
    """How long the source has been down, across the runs that retry it."""
    ended: bool = False
    """The current handle's run is over: ticks leave it to its last interval (see `_run`)."""
    reload: bool = False
    """A reload_model came while the entry had no handle (a start or a retry building one):
    `_launch` swaps once the handle is in, as the build may have resolved the old version."""
    swaps: int = 0
    """Swaps asked for so far: a failed one puts the record back only if it is the latest."""
    swap_lock: threading.Lock = field(default_factory=threading.Lock)
    """Held while a swap is recorded and asked for, and while a failed one is undone, so the
    record follows the swaps in the order they were asked for, as the handle's landings do."""


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


def parse_spec(data: dict[str, Any]) -> PipelineSpec:
    """Validate a spec from a command, naming the first bad field.

    A spec without `sinks` gets none: in the agent, results go to MQTT through the
    agent's own sink, and the CLI's default (JSON lines on stdout) would only fill
    the journal.
    """
    data = {"sinks": [], **data}
    try:
        return PipelineSpec.model_validate(data)
    except ValidationError as exc:
        where, message = first_error(exc, "spec.", data)
        raise EdgeAgentError(
            f"bad pipeline spec at {where}: {message}",
            "see the pipeline spec format in the README",
            code="command.invalid",
            # As a path check names it (`refuse_protected`): a console shows the field.
            field=f"args.{where}",
        ) from None


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
        self.max_running = max_running
        self.protected = (*layout.owned(), *protected)
        self.layout = layout
        self.records = records
        self.policy = policy
        self._emit_result = emit_result
        self._emit_event = emit_event
        self._clock = clock
        self._lock = threading.Lock()
        self._record_lock = threading.Lock()
        self._running: dict[str, _Running] = {}
        # Pipelines a restart has stopped and is starting again (`_restart`): their slots
        # stay theirs meanwhile, against a start_pipeline that came during the stop's join.
        self._restarting: set[str] = set()
        # Recorded pipelines a restore or a restart could not start, as list_pipelines
        # shows them, until a stop_pipeline forgets them (`_list_unrestored`).
        self._unrestored: dict[str, PipelineState] = {}
        # Last intervals of runs that ended, oldest first per pipeline, for the next ticks.
        self._last_intervals: dict[str, list[_Ended]] = {}
        self._closed = threading.Event()

    # --- commands ----------------------------------------------------------------------------
    def start(self, data: dict[str, Any], persist: bool = True) -> PipelineState:
        """Build and start a pipeline from a spec; raises if the id runs or the spec is bad."""
        return self._start(self._checked(data), persist)

    def _start(self, spec: PipelineSpec, persist: bool, own_slot: bool = False) -> PipelineState:
        with self._lock:
            entry = self._register(spec, own_slot)
        return self._start_registered(entry, persist)

    def _checked(self, data: dict[str, Any]) -> PipelineSpec:
        spec = parse_spec(data)
        # Before anything is opened: a sink is created as it opens.
        code, prefix = "command.invalid", "args.spec."
        # First: a relative sink path is made one inside the state folder, and then the
        # state's own parts are refused like any other spelling of them.
        spec = confine_writes(spec, self.layout.state, code=code, field_prefix=prefix)
        refuse_protected(spec, self.protected, code=code, field_prefix=prefix)
        return spec

    def _register(self, spec: PipelineSpec, own_slot: bool = False) -> _Running:
        """Hold a place for `spec` among the running (under `_lock`), or refuse it.
        `own_slot`: a restart's, which takes the slot it kept whatever the count."""
        if spec.id in self._running:
            raise EdgeAgentError(
                f"pipeline {spec.id} is already running",
                "stop it first, or use swap_model to change its model",
                code="pipeline.exists",
            )
        if spec.id in self._unrestored:
            raise EdgeAgentError(
                f"pipeline {spec.id} is recorded, and failed to start from its record "
                "(list_pipelines says why)",
                "stop it first: stop_pipeline forgets it",
                code="pipeline.exists",
            )
        taken = self._slots_taken(spec.id)
        if not own_slot and taken >= self.max_running:
            raise EdgeAgentError(
                f"the agent holds {taken} pipelines, its most (max_pipelines = {self.max_running})",
                "stop one with stop_pipeline (failed ones count too), or raise "
                "max_pipelines in the agent's config",
                code="command.busy",
            )
        entry = self._running[spec.id] = _Running(spec, outage=SourceOutage(spec.id))
        return entry

    def _slots_taken(self, pipeline_id: str) -> int:
        """Slots held by others than `pipeline_id` (under `_lock`): every listed pipeline,
        held and failed ones too, and those a restart is starting again."""
        return len((self._running.keys() | self._restarting) - {pipeline_id})

    def _start_registered(self, entry: _Running, persist: bool) -> PipelineState:
        spec = entry.spec
        try:
            self._launch(entry)
            if persist:
                # Under the record's lock, against a stop_pipeline that came during the
                # compile: it set `stopping` before it forgets the record, so either it
                # forgets this one after, or this sees it and records nothing.
                with self._record_lock:
                    if entry.stopping.is_set():
                        raise _stopped_while_starting(spec.id)
                    self._record_start(spec)
        except BaseException:
            with self._lock:
                ours = self._running.get(spec.id) is entry
                if ours:
                    del self._running[spec.id]
            if ours and entry.handle is not None:
                # Launched, then refused: it must not run on where no command can reach it.
                entry.stopping.set()
                entry.handle.stop()
                if entry.thread is not None:
                    entry.thread.join(5.0)
            raise
        return self._state(entry)

    def _record_start(self, spec: PipelineSpec) -> None:
        try:
            self._persist_locked(spec.id, spec)
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

    def _persist(self, pipeline_id: str, spec: PipelineSpec | None, known: bool = False) -> None:
        """Record `spec` as the pipeline to restore (None forgets it); `known`: only if the
        record already has it. Serialised: concurrent commands must not lose an update."""
        with self._record_lock:
            self._persist_locked(pipeline_id, spec, known)

    def _persist_locked(
        self, pipeline_id: str, spec: PipelineSpec | None, known: bool = False
    ) -> None:
        pipelines = dict(self.records.record.pipelines)
        if known and pipeline_id not in pipelines:
            return
        if spec is None:
            pipelines.pop(pipeline_id, None)
        else:
            pipelines[pipeline_id] = spec.model_dump(mode="json")
        self.records.update(pipelines=pipelines)

    def _launch(self, entry: _Running, retry: bool = False) -> None:
        spec = entry.spec
        sink = AgentSink(
            spec.id,
            self.policy,
            self._emit_result,
            self._emit_event,
            self._clock,
            outage=entry.outage,
        )
        with self._lock:
            entry.reload = False  # this build resolves the model afresh
        # Building compiles the model: on the command's thread, so its errors answer it.
        on_live = entry.outage.live if entry.outage is not None else None
        handle = PipelineHandle(spec, self.pool, [sink], layout=self.layout, on_live=on_live)
        with self._lock:
            # A stop_pipeline during the compile found no handle to stop: this one must
            # not run (stop sets `stopping` under this lock).
            stopped = entry.stopping.is_set()
            if not stopped:
                entry.handle, entry.sink, entry.ended = handle, sink, False
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
            self._swap_to(entry, handle, None)

    def _run(self, entry: _Running, handle: PipelineHandle) -> None:
        spec = entry.spec
        crashed: str | None = None
        try:
            handle.run()
        except Exception as exc:  # a bug in one pipeline must not take the agent down
            log_crash(log, "pipeline_crashed", pipeline=spec.id)
            crashed = f"crashed: {exc}"
        finally:
            with self._lock:
                # The model that served, and its report, before close() gives the model
                # back to the pool (which then forgets the report); under the lock `tick`
                # reads the pool under, so a run `tick` finds not ended holds its model.
                entry.ended = True
                model = self._serving_model(entry)
                report = self.pool.reports().get(model) or self.pool.last_report(model)
            handle.close()
        with self._lock:
            # What the run did since the last telemetry tick (closing included): a file that
            # plays out between two ticks, or a camera that fails, would otherwise never be
            # reported at all. A tick meanwhile leaves it out; the next one has all of it.
            last = _Ended(handle.telemetry.interval(), model, report)
            self._last_intervals.setdefault(spec.id, []).append(last)
        error = handle.pipeline.error
        with self._lock:
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
        elif error is not None:
            entry.status, entry.detail = "failed", str(error)
            self._event("pipeline_failed", spec.id, code=error.code, detail=str(error))
            if spec.source.type in _LIVE:
                if handle.telemetry.snapshot().frames:
                    # This run worked before it lost its feed: retries start again from the
                    # shortest wait. Left doubled, a camera's every outage after its first
                    # few would wait the full 5 minutes before the first retry.
                    entry.retry_s, entry.retries = _RETRY_MIN_S, 0
                entry.failed_code = error.code
                self._schedule_retry(entry)
        else:
            entry.status, entry.detail = "stopped", "source ended"
            self._event("pipeline_stopped", spec.id, detail="source ended")

    def _schedule_retry(self, entry: _Running) -> None:
        delay = entry.retry_s
        entry.retry_s = min(_RETRY_MAX_S, entry.retry_s * 2)
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
        with self._record_lock:
            with self._lock:
                entry = self._running.pop(pipeline_id, None)
                if entry is not None:
                    entry.stopping.set()
            if forget:
                recorded = self.records.record.pipelines.get(pipeline_id)
                if recorded is not None:
                    try:
                        self._persist_locked(pipeline_id, None)
                    except OSError as exc:
                        unwritable = exc  # still recorded: still listed, if it was
                    else:
                        with self._lock:
                            self._unrestored.pop(pipeline_id, None)
        if entry is None:
            # Recorded, not running: its restore failed (a model since removed, a spec this
            # version refuses), or is yet to come. Not found, it was tried and refused at
            # every start with no command able to remove it.
            if unwritable is not None:
                raise _not_forgotten(pipeline_id, unwritable, stopped=False)
            if recorded is not None:
                self._event("pipeline_stopped", pipeline_id, detail="forgotten: not running")
                model = _recorded_model(recorded)
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
            if unwritable is not None:
                raise _not_forgotten(pipeline_id, unwritable, stopped=True)
        return self._state(entry)

    def swap(self, pipeline_id: str, ref: dict[str, Any]) -> PipelineState:
        """Hot-swap the model of a running pipeline; the swap compiles in the background."""
        entry = self._get(pipeline_id)
        try:
            model = ModelRef.model_validate(ref)
        except ValidationError as exc:
            where, message = first_error(exc, "args.model.")
            raise EdgeAgentError(
                f"bad model at {where}: {message}", code="command.invalid"
            ) from None
        handle = self._live_handle(entry)
        if handle is None or entry.status != "running":
            raise EdgeAgentError(
                f"pipeline {pipeline_id} is {entry.status}, not running",
                "start it again first",
                code="pipeline.not_found",
            )
        if not isinstance(handle.pipeline, VisionPipeline):
            raise EdgeAgentError(
                f"pipeline {pipeline_id} runs audio; hot swap is for video pipelines",
                "stop the audio pipeline and start it with the new model",
                code="model.incompatible",
            )
        # What can be known before the compile (from the manifest: no model file is read
        # here) is said in the answer, not only as a swap_failed event after it: a path,
        # a model no one has, an audio model for a video pipeline, a device that does not
        # exist.
        self.pool.catalog.check_name(model.name)
        manifest = self.pool.catalog.manifest_of(model.name)
        if not isinstance(manifest.input, ImageInput):
            raise EdgeAgentError(
                f"{model.name} takes audio; pipeline {pipeline_id} runs video",
                "swap to an image model, or start an audio pipeline for it",
                code="model.incompatible",
            )
        parse_request(model.device)
        self._swap_to(entry, handle, model)
        return self._state(entry)

    def _swap_to(self, entry: _Running, handle: PipelineHandle, model: ModelRef | None) -> None:
        """Record `model` (None: the spec's own, for a reload) and ask `handle` to swap to it."""
        with entry.swap_lock:
            old = entry.spec.model
            model = model or old
            if model != old:  # a reload changes no record
                self._remember(entry, model)
            swap = entry.swaps + 1
            try:
                handle.swap_model(model, on_error=self._on_swap_error(entry, handle, swap))
            except BaseException:
                self._remember(entry, old)  # refused at once: the record keeps what runs
                raise
            entry.swaps = swap

    def _live_handle(self, entry: _Running) -> PipelineHandle | None:
        """The entry's handle, read once: a run that ends sets it to None (under the
        lock) at any moment, and a check of `entry.handle` then a use of it could meet
        None in between, after a deploy's store change had already happened."""
        with self._lock:
            return entry.handle

    def _remember(self, entry: _Running, model: ModelRef) -> None:
        # The record follows the swap at once, so a restart during the compile runs the
        # new model; a failed swap puts the old one back. Recorded first: a disk that
        # refuses leaves the entry naming what runs.
        spec = entry.spec.model_copy(update={"model": model})
        self._persist(spec.id, spec, known=True)
        entry.spec = spec

    def _on_swap_error(
        self, entry: _Running, handle: PipelineHandle, swap: int
    ) -> Callable[[EdgeAgentError], None]:
        def failed(exc: EdgeAgentError) -> None:
            with entry.swap_lock:
                current = self._live_handle(entry)
                if entry.swaps != swap or (current is not None and current is not handle):
                    # A later swap, or a new run, decides what runs and is recorded:
                    # putting this one's `old` back made the record name a model that no
                    # longer ran (a swap to A then to B, A failing after B had landed).
                    return
                # What runs is what the last swap to land left, not what the record said
                # when this one was asked: an earlier swap it superseded never landed.
                runs = handle.ref
                if entry.spec.model != runs:
                    try:
                        self._remember(entry, runs)
                    except OSError as unwritable:  # the event below still says what runs
                        log_event(
                            log,
                            logging.ERROR,
                            "pipeline_not_recorded",
                            pipeline=entry.spec.id,
                            error=str(unwritable),
                            fix="free space on the state disk; a restart runs the model "
                            "the record names",
                        )
            self._event(
                "pipeline_failed",
                entry.spec.id,
                code=exc.code,
                detail=f"swap failed, still running {runs.name}: {exc}",
            )

        return failed

    def reload_model(self, name: str) -> list[str]:
        """Move every pipeline on model `name` to what the catalog now resolves: a video
        pipeline swaps between frames (one still starting, once started), an audio one
        restarts on it. Returns those running or starting on it.

        Called after the store changed (a deploy, an activation, a rollback): nothing here
        may raise for one pipeline, or the command would be answered failed for a change
        that was made. An audio pipeline cannot swap, and its refusal did just that.
        """
        moved = []
        with self._lock:
            found = [(e, e.handle) for e in self._running.values() if e.spec.model.name == name]
            for entry, handle in found:
                if handle is None:
                    entry.reload = True
        for entry, handle in found:
            if handle is not None and not isinstance(handle.pipeline, VisionPipeline):
                if self._restart(entry):
                    moved.append(entry.spec.id)
                continue
            if handle is not None:
                self._swap_to(entry, handle, None)
            if handle is not None or entry.status == "starting":
                moved.append(entry.spec.id)
        return moved

    def _restart(self, entry: _Running) -> bool:
        """Stop a pipeline and start it again from its spec (its record untouched); a
        failure is said as the pipeline's, never raised (the store has changed).

        It keeps its slot throughout: reserved before the stop, so no start_pipeline takes
        it during the join, and started again whatever the count. Counted like a new one,
        a deploy stopped an audio pipeline for good whenever pipelines held over the cap
        (`restore`) filled it: the restart held the very pipeline it had stopped.
        """
        pipeline_id = entry.spec.id
        spec = entry.spec.model_dump(mode="json")
        recorded = pipeline_id in self.records.record.pipelines
        with self._lock:
            self._restarting.add(pipeline_id)
        try:
            self.stop(pipeline_id, forget=False)
            if recorded:
                # Only if still recorded, as a restore does: a stop_pipeline that came
                # during this stop's join found it not running and forgot it.
                restored = self._restore_one(pipeline_id, spec, own_slot=True)
                return restored in ("started", "running")
            self._start(self._checked(spec), persist=False, own_slot=True)
        except EdgeAgentError as exc:
            detail = f"restart on the new model failed: {exc}"
            self._event("pipeline_failed", pipeline_id, code=exc.code, detail=detail)
            return False
        except Exception as exc:  # a sink's OSError, a bug: this pipeline's, not the deploy's
            log_crash(log, "pipeline_restart_crashed", pipeline=pipeline_id)
            self._event("pipeline_failed", pipeline_id, code="internal", detail=str(exc))
            return False
        finally:
            with self._lock:
                self._restarting.discard(pipeline_id)
        return True

    def restore(self) -> list[str]:
        """Start every pipeline the record holds, returning those that run as it says (a
        command may have started one first); failures are reported, not raised.

        Past `max_running`, in the record's order, the rest are not started: each is kept in
        the record and listed as failed (`_restore_one`), until a restart with room starts
        it. Forgotten, as they were, a downgrade to a build with a lower cap, or a cap
        lowered for a while, lost them for good. Held, they count against the cap as any
        failed pipeline does, so a start_pipeline cannot take their place and then be the
        one left out at the next restart. Commands the broker held for the box may start
        pipelines before these, and take slots: the last recorded ones are held then.

        One that fails to start (a spec this build refuses, a model gone, a bug) is listed
        failed too (`_list_unrestored`), and kept in the record.
        """
        started = []
        held = []
        recorded = list(self.records.record.pipelines.items())
        for pipeline_id, data in recorded:
            try:
                restored = self._restore_one(pipeline_id, data)
                if restored in ("started", "running"):
                    started.append(pipeline_id)
                elif restored == "held":
                    held.append(pipeline_id)
            except EdgeAgentError as exc:
                log_event(
                    log,
                    logging.ERROR,
                    "pipeline_restore_failed",
                    pipeline=pipeline_id,
                    code=exc.code,
                    detail=str(exc),
                )
                self._event("pipeline_failed", pipeline_id, code=exc.code, detail=str(exc))
            except Exception as exc:
                # A bug, or an engine's own error, in one: the rest are still restored, and
                # those over the cap still held.
                log_crash(log, "pipeline_restore_crashed", pipeline=pipeline_id)
                self._event("pipeline_failed", pipeline_id, code="internal", detail=str(exc))
        if held:
            log_event(
                log,
                logging.ERROR,
                "pipelines_not_restored",
                pipelines=",".join(held),
                max_pipelines=self.max_running,
                fix="raise max_pipelines in the agent's config, or stop others; they are "
                "kept, and restored at the next start with room",
            )
        return started

    def _restore_one(
        self, pipeline_id: str, data: dict[str, Any], own_slot: bool = False
    ) -> Literal["started", "held", "running", "forgotten"]:
        """`_restore_or_hold`, listing the pipeline failed if it raises (and raising)."""
        try:
            return self._restore_or_hold(pipeline_id, data, own_slot)
        except Exception as exc:
            self._list_unrestored(pipeline_id, data, exc)
            raise

    def _list_unrestored(self, pipeline_id: str, data: dict[str, Any], exc: Exception) -> None:
        """List a recorded pipeline that failed to start from its record as failed, with
        why, until a stop_pipeline forgets it.

        Unlisted, it was in no list_pipelines and no retained state, with only an event and
        a log line to say so: after an upgrade that refuses what older builds recorded (a
        sink outside the state folder, a mic name ALSA would take for config), pipelines
        stopped coming back unseen. It takes no slot of `max_pipelines`: it holds nothing,
        and it would hold a recorded one that can run out of the restore.
        """
        code = exc.code if isinstance(exc, EdgeAgentError) else "internal"
        fix = exc.fix if isinstance(exc, EdgeAgentError) and exc.fix else "see the agent's log"
        detail = (
            f"not started from its record ({code}): {exc}; stop_pipeline forgets it, and a "
            f"start_pipeline can then start it anew ({fix})"
        )
        state = PipelineState(
            id=pipeline_id, model=_recorded_model(data), status="failed", detail=detail
        )
        with self._record_lock, self._lock:
            # Not one a stop_pipeline forgot meanwhile, nor one a start_pipeline runs.
            if pipeline_id in self.records.record.pipelines and pipeline_id not in self._running:
                self._unrestored[pipeline_id] = state

    def _restore_or_hold(
        self, pipeline_id: str, data: dict[str, Any], own_slot: bool
    ) -> Literal["started", "held", "running", "forgotten"]:
        """Start a recorded pipeline, or hold it over the cap; which it came to. `restore`
        works from the record as it read it, and commands the broker held for the box come
        in meanwhile: a stop_pipeline that forgot it (this used to start it anyway,
        unrecorded, gone at the next restart), or a start_pipeline of it (this used to
        report a running pipeline failed). `own_slot`: a restart's (`_restart`), never held.
        """
        spec = self._checked(self._as_known(pipeline_id, data))
        over_cap = (
            f"over max_pipelines ({self.max_running}): raise the cap in the config, or stop "
            "others; it starts at the next restart with room"
        )
        entry: _Running | None = None
        # Under the record's lock, as stop decides to forget one that does not run.
        with self._record_lock, self._lock:
            if pipeline_id not in self.records.record.pipelines:
                outcome: Literal["started", "held", "running", "forgotten"] = "forgotten"
            elif spec.id in self._running:
                outcome = "running"
            elif not own_slot and self._slots_taken(spec.id) >= self.max_running:
                # Listed as failed, not started: stop_pipeline forgets it as any failed
                # one, and it holds its slot against a start that would take its place.
                outcome = "held"
                self._running[spec.id] = _Running(
                    spec,
                    status="failed",
                    detail=over_cap,
                    failed_code="command.busy",
                    outage=SourceOutage(spec.id),
                )
            else:
                outcome = "started"
                entry = self._register(spec, own_slot)
        if entry is not None:
            self._start_registered(entry, persist=False)
        elif outcome == "held":
            self._event("pipeline_failed", pipeline_id, code="command.busy", detail=over_cap)
        elif outcome == "forgotten":
            log_event(
                log,
                logging.INFO,
                "pipeline_not_restored",
                pipeline=pipeline_id,
                detail="forgotten by a stop_pipeline meanwhile",
            )
        return outcome

    @staticmethod
    def _as_known(pipeline_id: str, data: dict[str, Any]) -> dict[str, Any]:
        """A recorded spec without the fields a newer edge-agent wrote (after a downgrade,
        every restore failed on them); any other error is left for `start` to report."""
        try:
            spec, dropped = drop_unknown_fields(
                lambda d: PipelineSpec.model_validate({"sinks": [], **d}), data
            )
        except ValidationError:
            return data
        if dropped:
            log_event(
                log,
                logging.WARNING,
                "pipeline_restore_fields_dropped",
                pipeline=pipeline_id,
                fields=",".join(dropped),
                detail="written by a newer edge-agent; this one does not know them",
            )
        return spec.model_dump(mode="json")

    # --- reading -----------------------------------------------------------------------------
    def _get(self, pipeline_id: str) -> _Running:
        with self._lock:
            entry = self._running.get(pipeline_id)
        if entry is None:
            raise EdgeAgentError(
                f"no pipeline {pipeline_id!r}",
                "list them with list_pipelines",
                code="pipeline.not_found",
            )
        return entry

    def _state(self, entry: _Running) -> PipelineState:
        status = entry.status if entry.status in ("starting", "running", "failed") else "stopped"
        return PipelineState(
            id=entry.spec.id,
            model=entry.spec.model.name,
            status=status,
            detail=entry.detail,
        )

    def states(self) -> list[PipelineState]:
        with self._lock:
            entries = list(self._running.values())
            unrestored = list(self._unrestored.values())
        return [*(self._state(e) for e in entries), *unrestored]

    def handles(self) -> dict[str, PipelineHandle]:
        """The running pipelines' handles, for telemetry."""
        with self._lock:
            return {
                i: e.handle
                for i, e in self._running.items()
                if e.handle is not None and e.status == "running"
            }

    @staticmethod
    def _serving_model(entry: _Running) -> str:
        """The model that made the pipeline's latest frame (a requested swap counts once it
        has landed), else the spec's."""
        sink = entry.sink
        return sink.model if sink is not None and sink.model else entry.spec.model.name

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
        with self._lock:  # against `_run` taking a last interval at the same moment
            held = self.pool.reports()  # every run not yet ended holds its model
            for pipeline_id, ended in self._last_intervals.items():
                stats[pipeline_id] = merge_intervals([e.stats for e in ended])
                models[pipeline_id] = ended[-1].model
                for run in ended:
                    if run.report is not None:
                        ended_reports[run.model] = run.report
            self._last_intervals.clear()
            for entry in self._running.values():
                if entry.handle is None or entry.status != "running" or entry.ended:
                    continue
                if entry.spec.id in stats:
                    continue
                snapshot = entry.handle.telemetry.interval()
                stats[entry.spec.id] = snapshot
                models[entry.spec.id] = self._serving_model(entry)
                if snapshot.frames > 0:
                    entry.fresh_at = now
        # What serves now wins over what served a run that has ended.
        reports = {**ended_reports, **held}
        for name in set(models.values()) - reports.keys():
            # The model of a pipeline's latest frame, retired by a swap since (the next
            # frame, from the new model, is not out yet): what it ran on is still known.
            retired = self.pool.last_report(name)
            if retired is not None:
                reports[name] = retired
        return Tick(stats, models, reports)

    def stale(self, max_age_s: float) -> list[str]:
        """Running pipelines that look wedged: the thread died, or a file source made no
        frame for `max_age_s`. A live source that waits for its camera is not wedged (it
        gives up by its own bounds and is retried), so only its thread is checked."""
        now = time.monotonic()
        with self._lock:
            entries = list(self._running.values())
        found = []
        for entry in entries:
            if entry.status != "running":
                continue
            alive = entry.thread is not None and entry.thread.is_alive()
            frames = entry.handle.telemetry.snapshot().frames if entry.handle else 0
            if frames != entry.frames_seen:
                entry.frames_seen, entry.fresh_at = frames, now
            idle = now - entry.fresh_at > max_age_s and entry.spec.source.type not in _LIVE
            if not alive or idle:
                found.append(entry.spec.id)
        return found

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
        with self._lock:
            ids = list(self._running)
        deadline = time.monotonic() + timeout
        for pipeline_id in ids:
            left = max(0.1, deadline - time.monotonic())
            with contextlib.suppress(EdgeAgentError):
                self.stop(pipeline_id, forget=False, timeout=left)


def _recorded_model(data: dict[str, Any]) -> str:
    """The model a recorded spec names, read without validating it ("-" for none)."""
    model = data.get("model")
    name = model.get("name") if isinstance(model, dict) else None
    return str(name or "-")


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
