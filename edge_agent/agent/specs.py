"""A pipeline spec as the agent takes it, from a command or from its record.

Validated with the first bad field named as the command's, and checked before
anything is opened: the files its sinks write confined to the state folder, and
no protected file or folder named.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from edge_agent.config_files import RECORDED, first_error
from edge_agent.errors import EdgeAgentError
from edge_agent.pipelines.confine import confine_writes, refuse_protected
from edge_agent.pipelines.spec import PipelineSpec


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
