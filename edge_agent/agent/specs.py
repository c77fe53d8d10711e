"""A pipeline spec as the agent takes it, from a command or from its record.

Validated with the first bad field named as the command's, and checked before
anything is opened: the files its sinks write confined to the state folder, and
no protected file or folder named.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from edge_agent.config_files import RECORDED, first_error
from edge_agent.errors import EdgeAgentError
from edge_agent.logs import log_event
from edge_agent.pipelines.confine import confine_writes, refuse_protected
from edge_agent.pipelines.detect import BOX_HEADS
from edge_agent.pipelines.spec import PipelineSpec

log = logging.getLogger(__name__)


def parse_spec(data: dict[str, Any], recorded: bool = False) -> PipelineSpec:
    """Validate a spec from a command, or from the record (`recorded`), naming the first
    bad field.

    A spec without `sinks` gets none: in the agent, results go to MQTT through the
    agent's own sink, and the CLI's default (JSON lines on stdout) would only fill
    the journal.
    """
    data = {"sinks": [], **data}
    try:
        return PipelineSpec.model_validate(data, context={RECORDED: True} if recorded else None)
    except ValidationError as exc:
        where, message = first_error(exc, "spec.", data)
        raise EdgeAgentError(
            f"bad pipeline spec at {where}: {message}",
            "see the pipeline spec format in the README",
            code="command.invalid",
            # As a path check names it (`refuse_protected`): a console shows the field.
            field=f"args.{where}",
        ) from None


def checked_spec(
    data: dict[str, Any], state: Path, protected: Iterable[Path], recorded: bool = False
) -> PipelineSpec:
    """`parse_spec`, then the paths it names; raises `command.invalid` naming the field.

    Args:
        data: The spec, as a command or the record gives it.
        state: The state folder: a relative sink path is taken inside it.
        protected: Files and folders no pipeline may name.
        recorded: `data` is from the record: what an earlier build accepted and was
            harmless is mended, not refused (`config_files.RECORDED`).

    Returns:
        The spec, with its sinks' paths inside the state folder.
    """
    spec = parse_spec(data, recorded)
    # Before anything is opened: a sink is created as it opens.
    code, prefix = "command.invalid", "args.spec."
    # First: a relative sink path is made one inside the state folder, and then the
    # state's own parts are refused like any other spelling of them.
    spec = confine_writes(spec, state, code=code, field_prefix=prefix)
    refuse_protected(spec, protected, code=code, field_prefix=prefix)
    return spec


def mend_recorded_mode(spec: PipelineSpec, head_of: Callable[[str], str | None]) -> PipelineSpec:
    """A recorded spec in tiles or regions mode on a model whose head is not a detector's,
    in frame mode, with a warning; any other spec as it is.

    Earlier builds ran such a spec, tiling a classifier or a text detector into one
    unmerged result per tile; this one refuses it at the build (`check_mode`), and the
    pipeline came back from an upgrade failed. Frame mode is what that model can serve.

    Args:
        spec: A spec from the record.
        head_of: The head type of a model by name, or None when it cannot be told (the
            build then reports what is wrong with the model).
    """
    if spec.detect.mode == "frame":
        return spec
    head = head_of(spec.model.name)
    if head is None or head in BOX_HEADS:
        return spec
    log_event(
        log,
        logging.WARNING,
        "pipeline_restore_mended",
        pipeline=spec.id,
        detail=f'detect mode "{spec.detect.mode}" needs a detector, and {spec.model.name} '
        f'has a {head} head: run in mode "frame"',
        fix='start the pipeline again with mode = "frame" to keep this from the record',
    )
    return spec.model_copy(update={"detect": spec.detect.model_copy(update={"mode": "frame"})})
