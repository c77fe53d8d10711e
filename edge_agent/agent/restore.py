"""Bringing back, at the agent's start, the pipelines its record holds.

What was started by command is written to the agent record (`roster.py`), so a
restart or a reboot brings the same pipelines back without the fleet resending
anything. Those past `max_pipelines` are held: kept in the record and listed as
failed, until a restart with room. One that fails to start from its record is
listed as failed too, and kept, until a stop_pipeline forgets it; a camera, stream or
mic whose build failed for a reason that may pass (a full disk, a model not yet
delivered) is retried instead, as one that lost its feed is. One that had finished (its
file played to its end, or its max_frames run, whatever the source) is listed stopped,
and not run again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import ValidationError

from edge_agent.agent.outage import SourceOutage
from edge_agent.agent.roster import Roster, Running, Say, ended_how, recorded_model
from edge_agent.config_files import RECORDED, drop_unknown_fields
from edge_agent.errors import EdgeAgentError
from edge_agent.logs import log_crash, log_event
from edge_agent.pipelines.spec import PipelineSpec
from edge_agent.protocol.agent import PipelineState

log = logging.getLogger(__name__)

Outcome = Literal["started", "retrying", "held", "running", "forgotten", "finished"]
"""What a recorded pipeline came to (`Restorer.restore_one`)."""


class Restorer:
    """Starts the pipelines the record holds, holds those over the cap, lists the rest.

    Args:
        roster: The pipelines held, and the record.
        check: Validates a spec and checks its paths (`specs.checked_spec`, by `Pipelines`).
        start: Starts a registered entry without recording it again, or keeps a live one
            failed to retry it (`Pipelines._start_recorded`).
        say: Says a pipeline's event.
    """

    def __init__(
        self,
        roster: Roster,
        check: Callable[[dict[str, Any]], PipelineSpec],
        start: Callable[[Running], PipelineState],
        say: Say,
    ) -> None:
        self._roster = roster
        self._check = check
        self._start = start
        self._say = say

    def restore(self) -> list[str]:
        """Start every pipeline the record holds, returning those that run as it says (a
        command may have started one first); failures are reported, not raised.

        Past `max_running`, in the record's order, the rest are not started: each is kept in
        the record and listed as failed (`restore_one`), until a restart with room starts
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
        recorded = list(self._roster.records.record.pipelines.items())
        for pipeline_id, data in recorded:
            try:
                restored = self.restore_one(pipeline_id, data)
                if restored in ("started", "running"):
                    started.append(pipeline_id)
                elif restored == "held":
                    held.append(pipeline_id)
            except Exception as exc:
                # A bug, or an engine's own error, in one: the rest are still restored, and
                # those over the cap still held.
                self.failed(pipeline_id, exc)
        if held:
            log_event(
                log,
                logging.ERROR,
                "pipelines_not_restored",
                pipelines=",".join(held),
                max_pipelines=self._roster.max_running,
                fix="raise max_pipelines in the agent's config, or stop others; they are "
                "kept, and restored at the next start with room",
            )
        return started

    def start_held(self, closed: Callable[[], bool] = lambda: False) -> list[str]:
        """Start the pipelines held over the cap, in the record's order, while there is
        room and until `closed`; call after a stop_pipeline freed a slot. Returns those
        started.

        Held until the next restart, as they were, the room an operator made by stopping
        a pipeline (as the held one's detail tells them to) was taken by nothing, or by the
        next start_pipeline, and the held pipeline stayed down until a reboot.
        """
        roster = self._roster
        with roster.record_lock, roster.lock:
            held = [
                (pipeline_id, data)
                for pipeline_id, data in roster.records.record.pipelines.items()
                if (entry := roster.running.get(pipeline_id)) is not None and entry.held
            ]
        started = []
        for pipeline_id, data in held:
            if closed():
                break
            with roster.lock:
                entry = roster.running.get(pipeline_id)
                if entry is None or not entry.held:
                    continue  # stopped meanwhile
                if roster.slots_taken(pipeline_id, count_held=False) >= roster.max_running:
                    break  # no room for this one, nor for those after it
            try:
                if self.restore_one(pipeline_id, data) == "started":
                    started.append(pipeline_id)
            except Exception as exc:
                self.failed(pipeline_id, exc)
        return started

    def failed(self, pipeline_id: str, exc: Exception, detail: str | None = None) -> None:
        """Say that a recorded pipeline did not start: its error, or a crash's traceback;
        the event's detail is `detail`, or the error's."""
        if isinstance(exc, EdgeAgentError) and exc.code == "command.cancelled":
            # A stop_pipeline came while it was built (one the broker held for the box, as
            # often as not): answered stopped and said so. Said failed too, with an ERROR,
            # a console showed the operator's own stop as a failure.
            log_event(
                log,
                logging.INFO,
                "pipeline_not_restored",
                pipeline=pipeline_id,
                detail="stopped by a stop_pipeline while it started",
            )
            return
        if isinstance(exc, EdgeAgentError):
            log_event(
                log,
                logging.ERROR,
                "pipeline_restore_failed",
                pipeline=pipeline_id,
                code=exc.code,
                detail=str(exc),
            )
            self._say("pipeline_failed", pipeline_id, code=exc.code, detail=detail or str(exc))
        else:
            log_crash(log, "pipeline_restore_crashed", pipeline=pipeline_id)
            self._say("pipeline_failed", pipeline_id, code="internal", detail=detail or str(exc))

    def restore_one(
        self, pipeline_id: str, data: dict[str, Any], own_slot: bool = False
    ) -> Outcome:
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
            id=pipeline_id, model=recorded_model(data), status="failed", detail=detail
        )
        roster = self._roster
        with roster.record_lock, roster.lock:
            # Not one a stop_pipeline forgot meanwhile, nor one a start_pipeline runs.
            if pipeline_id in roster.records.record.pipelines and pipeline_id not in roster.running:
                roster.unrestored[pipeline_id] = state

    def _list_finished(self, pipeline_id: str, data: dict[str, Any]) -> bool:
        """List a recorded pipeline that had finished (`Running.finished`: its file played
        to its end, or its max_frames run) stopped, not run again, until a stop_pipeline
        forgets it; whether it was one. Before its spec is checked:
        nothing of it runs, so an upgrade that refuses the spec has nothing to refuse.

        Like one that failed to start, it takes no slot (it holds nothing), and its id is
        refused `pipeline.exists` (`Roster.register`) as it was before the restart.
        """
        roster = self._roster
        with roster.record_lock, roster.lock:
            record = roster.records.record
            ended = record.finished.get(pipeline_id)
            # Not one a start_pipeline runs (its start cleared the mark, unless the disk
            # refused it), nor one a stop_pipeline forgot meanwhile.
            if (
                ended is None
                or pipeline_id not in record.pipelines
                or pipeline_id in roster.running
            ):
                return False
            at = datetime.fromtimestamp(ended, UTC).isoformat(timespec="seconds")
            how = ended_how(data)
            detail = (
                f"{how} at {at}; not run again after a restart: "
                "stop_pipeline forgets it, and a start_pipeline can then run it anew"
            )
            roster.unrestored[pipeline_id] = PipelineState(
                id=pipeline_id, model=recorded_model(data), status="stopped", detail=detail
            )
        log_event(
            log,
            logging.INFO,
            "pipeline_not_restored",
            pipeline=pipeline_id,
            detail=f"finished: {how} at {at}",
        )
        return True

    def _restore_or_hold(self, pipeline_id: str, data: dict[str, Any], own_slot: bool) -> Outcome:
        """Start a recorded pipeline, or hold it over the cap; which it came to. `restore`
        works from the record as it read it, and commands the broker held for the box come
        in meanwhile: a stop_pipeline that forgot it (this used to start it anyway,
        unrecorded, gone at the next restart), or a start_pipeline of it (this used to
        report a running pipeline failed). `own_slot`: a restart's (`Pipelines._restart`),
        never held.
        """
        roster = self._roster
        if self._list_finished(pipeline_id, data):
            return "finished"
        spec = self._check(_as_known(pipeline_id, data))
        over_cap = (
            f"over max_pipelines ({roster.max_running}): raise the cap in the config, or stop "
            "others; it starts as soon as a stop_pipeline makes room, or at the next restart "
            "with room"
        )
        entry: Running | None = None
        # Under the record's lock, as stop decides to forget one that does not run.
        cap = roster.max_running
        with roster.record_lock, roster.lock:
            current = roster.running.get(spec.id)
            if pipeline_id not in roster.records.record.pipelines or (
                # A restart's, stopped meanwhile: forgotten, or still recorded if the disk
                # refused to forget it, it must not run on behind a stop answered stopped.
                own_slot and pipeline_id in roster.restart_stopped
            ):
                outcome: Outcome = "forgotten"
            elif current is not None and not current.held:
                outcome = "running"
            elif not own_slot and roster.slots_taken(spec.id, current is None) >= cap:
                # Listed as failed, not started: stop_pipeline forgets it as any failed
                # one, and it holds its slot against a start that would take its place.
                outcome = "held"
                if current is None:  # one held already stays as it is
                    roster.running[spec.id] = Running(
                        spec,
                        status="failed",
                        detail=over_cap,
                        failed_code="command.busy",
                        outage=SourceOutage(spec.id),
                        held=True,
                    )
            else:
                outcome = "started"
                if current is not None:  # held: the room was counted above, without
                    del roster.running[spec.id]  # the held ones after it in the record
                entry = roster.register(spec, own_slot or current is not None)
        if entry is not None:
            if self._start(entry).status == "failed":
                outcome = "retrying"  # a live source kept, failed, until a retry starts it
        elif outcome == "held":
            self._say("pipeline_failed", pipeline_id, code="command.busy", detail=over_cap)
        elif outcome == "forgotten":
            log_event(
                log,
                logging.INFO,
                "pipeline_not_restored",
                pipeline=pipeline_id,
                detail="forgotten by a stop_pipeline meanwhile",
            )
        return outcome


def _as_known(pipeline_id: str, data: dict[str, Any]) -> dict[str, Any]:
    """A recorded spec without the fields a newer edge-agent wrote (after a downgrade,
    every restore failed on them); any other error is left for `start` to report."""
    try:
        spec, dropped = drop_unknown_fields(
            # As the restore reads it (`RECORDED`): a spec with a newer build's field and
            # one an earlier build accepted must lose the one and keep the other.
            lambda d: PipelineSpec.model_validate({"sinks": [], **d}, context={RECORDED: True}),
            data,
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
