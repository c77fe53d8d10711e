"""Hot swaps: a video pipeline moved to another model between two frames.

By command (swap_model), or because the store changed what a model's name resolves
to (a deploy, an activation, a rollback: `reload_model`). The swap compiles in the
background; the record follows it at once, so a restart during the compile runs the
new model, and a swap that fails puts back the model that runs. An audio pipeline
cannot swap: a reload restarts it on the new version.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from edge_agent.agent.loaded import TrackedPool
from edge_agent.agent.roster import Roster, Running, Say, state_of
from edge_agent.catalog.manifest import ImageInput
from edge_agent.config_files import first_error
from edge_agent.errors import EdgeAgentError
from edge_agent.logs import log_event
from edge_agent.pipelines.detect import check_mode
from edge_agent.pipelines.runner import PipelineHandle
from edge_agent.pipelines.spec import ModelRef
from edge_agent.pipelines.vision import VisionPipeline
from edge_agent.protocol.agent import PipelineState
from edge_agent.runtime.devices import parse_request

log = logging.getLogger(__name__)


class Swaps:
    """Swaps the models of running pipelines, and keeps the record naming what runs.

    Args:
        roster: The pipelines held, and the record.
        pool: Compiled models, shared; its catalog checks a model before the swap.
        say: Says a pipeline's event.
        restart: Stops a pipeline and starts it again from its spec, saying any failure
            as the pipeline's; whether it runs again (`Pipelines._restart`).
    """

    def __init__(
        self,
        roster: Roster,
        pool: TrackedPool,
        say: Say,
        restart: Callable[[Running], bool],
    ) -> None:
        self._roster = roster
        self._pool = pool
        self._say = say
        self._restart = restart

    def swap(self, pipeline_id: str, ref: dict[str, Any]) -> PipelineState:
        """Hot-swap the model of a running pipeline; the swap compiles in the background."""
        entry = self._roster.get(pipeline_id)
        try:
            model = ModelRef.model_validate(ref)
        except ValidationError as exc:
            where, message = first_error(exc, "args.model.")
            raise EdgeAgentError(
                f"bad model at {where}: {message}", code="command.invalid"
            ) from None
        handle = self._roster.live_handle(entry)
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
        self._pool.catalog.check_name(model.name)
        manifest = self._pool.catalog.manifest_of(model.name)
        if not isinstance(manifest.input, ImageInput):
            raise EdgeAgentError(
                f"{model.name} takes audio; pipeline {pipeline_id} runs video",
                "swap to an image model, or start an audio pipeline for it",
                code="model.incompatible",
            )
        check_mode(entry.spec.detect.mode, manifest)
        parse_request(model.device)
        self.swap_to(entry, handle, model)
        return state_of(entry)

    def swap_to(self, entry: Running, handle: PipelineHandle, model: ModelRef | None) -> None:
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

    def _remember(self, entry: Running, model: ModelRef) -> None:
        # The record follows the swap at once, so a restart during the compile runs the
        # new model; a failed swap puts the old one back. Recorded first: a disk that
        # refuses leaves the entry naming what runs.
        spec = entry.spec.model_copy(update={"model": model})
        self._roster.persist(spec.id, spec, known=True)
        entry.spec = spec

    def _on_swap_error(
        self, entry: Running, handle: PipelineHandle, swap: int
    ) -> Callable[[EdgeAgentError], None]:
        def failed(exc: EdgeAgentError) -> None:
            with entry.swap_lock:
                current = self._roster.live_handle(entry)
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
            self._say(
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
        with self._roster.lock:
            found = [
                (e, e.handle) for e in self._roster.running.values() if e.spec.model.name == name
            ]
            for entry, handle in found:
                if handle is None:
                    entry.reload = True
        for entry, handle in found:
            if handle is not None and not isinstance(handle.pipeline, VisionPipeline):
                if self._restart(entry):
                    moved.append(entry.spec.id)
                continue
            if handle is not None:
                self.swap_to(entry, handle, None)
            if handle is not None or entry.status == "starting":
                moved.append(entry.spec.id)
        return moved
