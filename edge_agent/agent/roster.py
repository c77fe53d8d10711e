"""The pipelines the agent holds, and the record of those a restart brings back.

One table, shared by the supervisor (`pipelines.py`), the restore at start
(`restore.py`), the hot swaps (`swaps.py`) and the telemetry ticks (`ticks.py`):
each pipeline's entry (`Running`), the slots of `max_pipelines` they take, the
recorded ones that failed to start from their record, and the agent record's list
of pipelines to restore. Two locks guard it: `lock` the table, `record_lock` the
record; where both are held, `record_lock` is taken first.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from edge_agent.agent.outage import SourceOutage
from edge_agent.agent.records import AgentRecords
from edge_agent.agent.sink import AgentSink
from edge_agent.errors import EdgeAgentError
from edge_agent.pipelines.runner import PipelineHandle
from edge_agent.pipelines.spec import PipelineSpec
from edge_agent.protocol.agent import PipelineState

LIVE = {"camera", "stream", "mic"}
RETRY_MIN_S, RETRY_MAX_S = 5.0, 300.0


@dataclass
class Running:
    """One pipeline the agent holds: its spec, its current run, and its retries."""

    spec: PipelineSpec
    status: str = "starting"
    detail: str = ""
    handle: PipelineHandle | None = None
    sink: AgentSink | None = None
    thread: threading.Thread | None = None
    stopping: threading.Event = field(default_factory=threading.Event)
    frames_seen: int = 0
    fresh_at: float = field(default_factory=time.monotonic)
    retry_s: float = RETRY_MIN_S
    retries: int = 0
    """Retries since the pipeline last ran with frames; said in each retry's start event."""
    failed_code: str = ""
    """The code of the failure the next retry follows."""
    outage: SourceOutage | None = None
    """How long the source has been down, across the runs that retry it."""
    finished: bool = False
    """Its run did all that was asked of it: a file played to its end, or the `max_frames`
    it was given, whatever the source (`Pipelines._run`). Listed stopped until a
    stop_pipeline, it computes nothing, so it holds no slot of `max_pipelines`
    (`Roster.slots_taken`)."""
    ended: bool = False
    """The current handle's run is over: ticks leave it to its last interval (see
    `Pipelines._run`)."""
    reload: bool = False
    """A reload_model came while the entry had no handle (a start or a retry building one):
    `Pipelines._launch` swaps once the handle is in, as the build may have resolved the old
    version."""
    held: bool = False
    """Listed failed, not started: over `max_pipelines` at a restore (`Restorer`); started
    when a stop_pipeline makes room (`Restorer.start_held`)."""
    swaps: int = 0
    """Swaps asked for so far: a failed one puts the record back only if it is the latest."""
    swap_lock: threading.Lock = field(default_factory=threading.Lock)
    """Held while a swap is recorded and asked for, and while a failed one is undone, so the
    record follows the swaps in the order they were asked for, as the handle's landings do."""


class Say(Protocol):
    """Says a pipeline's event to the fleet (`Pipelines._event`)."""

    def __call__(
        self, kind: str, pipeline: str, code: str | None = None, detail: str = ""
    ) -> None: ...


class Roster:
    """Every pipeline the agent holds, failed and held ones too, and its record of them.

    Args:
        records: Where the running set is persisted.
        max_running: Pipelines held at most, failed ones included (`max_pipelines`).
    """

    def __init__(self, records: AgentRecords, max_running: int) -> None:
        self.records = records
        self.max_running = max_running
        self.lock = threading.Lock()
        self.record_lock = threading.Lock()
        self.running: dict[str, Running] = {}
        # Pipelines a restart has stopped and is starting again (`Pipelines._restart`), with
        # the model each runs: their slots stay theirs meanwhile, against a start_pipeline
        # that came during the stop's join.
        self.restarting: dict[str, str] = {}
        # Those of them a stop_pipeline stopped meanwhile: their restart must not start them
        # again. Found in neither the running nor (started unrecorded) the record, such a
        # stop was answered `pipeline.not_found`, and the restart ran the pipeline on.
        self.restart_stopped: set[str] = set()
        # Recorded pipelines a restore or a restart did not start, as list_pipelines shows
        # them, until a stop_pipeline forgets them: failed, those it could not start
        # (`Restorer._list_unrestored`); stopped, those that had finished: a file played
        # to its end, or the max_frames given run (`Restorer._list_finished`).
        self.unrestored: dict[str, PipelineState] = {}

    def register(self, spec: PipelineSpec, own_slot: bool = False) -> Running:
        """Hold a place for `spec` among the running (under `lock`), or refuse it.
        `own_slot`: a restart's, which takes the slot it kept whatever the count, unless a
        stop_pipeline stopped it meanwhile (`restart_stopped`): then it is not run again."""
        if own_slot and spec.id in self.restart_stopped:
            raise EdgeAgentError(
                f"pipeline {spec.id} was stopped while it restarted",
                "start it again if it should run",
                code="command.cancelled",
            )
        held = self.running.get(spec.id)
        if held is not None and held.status == "stopped":
            # Its source ended (a file played out, its max_frames run): "already running"
            # sent the operator looking for a run there was not. Only a finished one is
            # said to have done all it was asked (a live run's source can close under it).
            how = ended_how(held.spec.model_dump()) if held.finished else "ended its run"
            raise EdgeAgentError(
                f"pipeline {spec.id} {how}, and is listed until stopped",
                "stop it first: stop_pipeline forgets it, then start it to run it anew",
                code="pipeline.exists",
            )
        if held is not None:
            raise EdgeAgentError(
                f"pipeline {spec.id} is already running",
                "stop it first, or use swap_model to change its model",
                code="pipeline.exists",
            )
        listed = self.unrestored.get(spec.id)
        if listed is not None:
            why = (
                f"{ended_how(self.records.record.pipelines.get(spec.id, {}))} before the "
                "agent's restart"
                if listed.status == "stopped"
                else "failed to start from its record (list_pipelines says why)"
            )
            raise EdgeAgentError(
                f"pipeline {spec.id} is recorded, and {why}",
                "stop it first: stop_pipeline forgets it",
                code="pipeline.exists",
            )
        taken = self.slots_taken(spec.id)
        if not own_slot and taken >= self.max_running:
            raise EdgeAgentError(
                f"the agent holds {taken} pipelines, its most (max_pipelines = {self.max_running})",
                "stop one with stop_pipeline (failed ones count too), or raise "
                "max_pipelines in the agent's config",
                code="command.busy",
            )
        entry = self.running[spec.id] = Running(spec, outage=SourceOutage(spec.id))
        return entry

    def slots_taken(self, pipeline_id: str, count_held: bool = True) -> int:
        """Slots held by others than `pipeline_id` (under `lock`): every listed pipeline,
        held and failed ones too, and those a restart is starting again; not the finished
        ones (`Running.finished`), which compute nothing. Without `count_held`, not those
        held over the cap either: for a held one taking the room made, which goes to the
        held ones in the record's order (`Restorer.start_held`)."""
        listed = {
            k
            for k, entry in self.running.items()
            if not entry.finished and (count_held or not entry.held)
        }
        return len((listed | self.restarting.keys()) - {pipeline_id})

    def persist(self, pipeline_id: str, spec: PipelineSpec | None, known: bool = False) -> None:
        """Record `spec` as the pipeline to restore (None forgets it); `known`: only if the
        record already has it. Serialised: concurrent commands must not lose an update."""
        with self.record_lock:
            self.persist_locked(pipeline_id, spec, known)

    def persist_locked(
        self, pipeline_id: str, spec: PipelineSpec | None, known: bool = False
    ) -> None:
        """`persist`, for a caller that holds `record_lock`. A start (not `known`) or a
        forget also clears the pipeline's finished mark (`finished_locked`): a new start
        runs it anew. A swap (`known`) keeps it: it starts no new run."""
        record = self.records.record
        pipelines = dict(record.pipelines)
        if known and pipeline_id not in pipelines:
            return
        if spec is None:
            pipelines.pop(pipeline_id, None)
        else:
            pipelines[pipeline_id] = spec.model_dump(mode="json")
        finished = record.finished
        if not known:
            finished = {k: at for k, at in finished.items() if k != pipeline_id}
        self.records.update(pipelines=pipelines, finished=finished)

    def finished_locked(self, pipeline_id: str, at: float) -> None:
        """Mark a recorded pipeline finished (`Running.finished`) at `at` (Unix seconds), for a
        caller that holds `record_lock`; one not recorded (started with persist off, or
        forgotten meanwhile) is left alone. Raises OSError when the disk refuses."""
        record = self.records.record
        if pipeline_id in record.pipelines:
            self.records.update(finished={**record.finished, pipeline_id: at})

    def get(self, pipeline_id: str) -> Running:
        """The entry of `pipeline_id`; raises if the agent holds none."""
        with self.lock:
            entry = self.running.get(pipeline_id)
        if entry is None:
            raise EdgeAgentError(
                f"no pipeline {pipeline_id!r}",
                "list them with list_pipelines",
                code="pipeline.not_found",
            )
        return entry

    def live_handle(self, entry: Running) -> PipelineHandle | None:
        """The entry's handle, read once: a run that ends sets it to None (under the
        lock) at any moment, and a check of `entry.handle` then a use of it could meet
        None in between, after a deploy's store change had already happened."""
        with self.lock:
            return entry.handle

    def states(self) -> list[PipelineState]:
        """Every pipeline held, then the recorded ones that failed to start from the record."""
        with self.lock:
            entries = list(self.running.values())
            unrestored = list(self.unrestored.values())
        return [*(state_of(e) for e in entries), *unrestored]

    def handles(self) -> dict[str, PipelineHandle]:
        """The running pipelines' handles, for telemetry."""
        with self.lock:
            return {
                i: e.handle
                for i, e in self.running.items()
                if e.handle is not None and e.status == "running"
            }


def ended_how(data: dict[str, Any]) -> str:
    """How a finished pipeline of spec `data` (as recorded) ended, as its detail and a
    refused start say it: a live source never plays to an end, so one finished ran the
    `max_frames` it was given; a file given one may have ended first, or not."""
    source = data.get("source")
    kind = source.get("type") if isinstance(source, dict) else None
    max_frames = data.get("max_frames")
    if kind in LIVE and max_frames:
        return f"ran the max_frames ({max_frames}) it was given"
    if max_frames:
        return f"played its source to the end or to its max_frames ({max_frames})"
    return "played its source to the end"


def state_of(entry: Running) -> PipelineState:
    """The entry as list_pipelines shows it."""
    status = entry.status if entry.status in ("starting", "running", "failed") else "stopped"
    return PipelineState(
        id=entry.spec.id,
        model=entry.spec.model.name,
        status=status,
        detail=entry.detail,
    )


def serving_model(entry: Running) -> str:
    """The model that made the pipeline's latest frame (a requested swap counts once it
    has landed), else the spec's."""
    sink = entry.sink
    return sink.model if sink is not None and sink.model else entry.spec.model.name


def recorded_model(data: dict[str, Any]) -> str:
    """The model a recorded spec names, read without validating it ("-" for none)."""
    model = data.get("model")
    name = model.get("name") if isinstance(model, dict) else None
    return str(name or "-")
