"""Read a TOML (or JSON) file into a strict pydantic model, or fail in one line.

Manifests, pipeline specs and calibration recipes are all operator-written
files; a mistake in any of them gets the same treatment: the file, the first
bad field, and what to do.
"""

from __future__ import annotations

import copy
import json
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, SecretStr, ValidationError, ValidationInfo

from edge_agent.errors import EdgeAgentError

Model = TypeVar("Model", bound=BaseModel)


RECORDED = "recorded"
"""In a validation context (`PipelineSpec.model_validate(d, context={RECORDED: True})`): the
spec comes from the agent's record, written by this build or an earlier one, so what an
earlier build accepted and what served is mended or kept, not refused: refused, it kept
the whole pipeline from coming back after an upgrade. A new spec is still refused."""


def is_recorded(info: ValidationInfo) -> bool:
    """Whether a validator runs on what the agent's record holds (`RECORDED`)."""
    return RECORDED in (info.context or {})


def load_validated(path: Path, model: type[Model], what: str, fix: str = "") -> Model:
    """Parse `path` (.json as JSON, anything else as TOML) and validate it as `model`.

    Raises:
        EdgeAgentError: missing, unreadable, or invalid, naming the first bad field.
    """
    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except FileNotFoundError:
        raise EdgeAgentError(
            f"{what} {path} does not exist", "check the path", code="input.not_found"
        ) from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise EdgeAgentError(
            f"{what} {path} is unreadable: {exc}",
            "check it is UTF-8 TOML (.toml) or JSON (.json)",
            code="config.invalid",
        ) from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        where, message = first_error(exc)
        raise EdgeAgentError(
            f"{what} {path} is invalid at {where}: {message}", fix, code="config.invalid"
        ) from None


def first_error(exc: ValidationError, prefix: str = "", data: Any = None) -> tuple[str, str]:
    """The dotted place and the message of a validation error's first problem: what every
    one-line error about a bad field names (files, specs, commands, releases).

    Args:
        exc: The error.
        prefix: Put before the place (`spec.`).
        data: What was validated: given, the place is the field's in it, without the
            parts pydantic adds that are no key of it (a tagged union's tag, as in
            `source.mic.device`), so that it names what the sender can find and change.
    """
    first = exc.errors()[0]
    loc = first["loc"] if data is None else _data_loc(first["loc"], data)
    where = ".".join(str(p) for p in loc)
    return (f"{prefix}{where}" if where else prefix.rstrip(".") or "(top)"), first["msg"]


def _data_loc(loc: tuple[int | str, ...], data: Any) -> list[int | str]:
    found: list[int | str] = []
    node = data
    for i, part in enumerate(loc):
        is_key = isinstance(node, dict) and part in node
        is_index = isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)
        if is_key or is_index:
            found.append(part)
            node = node[part]
        elif isinstance(node, dict) and i == len(loc) - 1:
            found.append(part)  # a field missing, or one not known
    return found


def read_secret(path: Path, what: str, fix: str, code: str) -> SecretStr:
    """The first line of a secret file (a password), '' for an empty file.

    Raises:
        EdgeAgentError: `code`, naming `what` and `path`, when the file cannot be read.
    """
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise EdgeAgentError(
            f"cannot read the {what} from {path}: {getattr(exc, 'strerror', None) or exc}",
            fix,
            code=code,
        ) from None
    return SecretStr(lines[0] if lines else "")


def drop_unknown_fields(
    validate: Callable[[Any], Model], data: Any, rounds: int = 20
) -> tuple[Model, list[str]]:
    """Validate a record this process wrote, or a newer edge-agent did: fields this version
    does not know are dropped (and named), every other error still raises.

    Messages and configs stay strict (`extra="forbid"`): a typo there must be an error.
    A record on disk is different: after a downgrade, a field a newer version wrote (a
    spec's `reduced_decode`, once) failed every pipeline at restore, and a new top-level
    field set the whole of agent.json aside. What a newer version meant by such a field
    is lost; the rest of the record is not.

    Returns:
        The model, and the dotted places of the fields dropped.

    Raises:
        ValidationError: any error other than an unknown field.
    """
    data = copy.deepcopy(data)
    dropped: list[str] = []
    for _ in range(rounds):
        try:
            return validate(data), dropped
        except ValidationError as exc:
            unknown = [e["loc"] for e in exc.errors() if e["type"] == "extra_forbidden"]
            if len(unknown) < len(exc.errors()) or not all(_pop(data, loc) for loc in unknown):
                raise
            dropped += [".".join(str(part) for part in loc) for loc in unknown]
    return validate(data), dropped


def _pop(data: Any, loc: tuple[int | str, ...]) -> bool:
    # A loc runs through dict keys and list indices, and through a tagged union's tag
    # (`source.stream.x`), which is no key of the data: such a part is passed over.
    node = data
    for part in loc[:-1]:
        is_key = isinstance(node, dict) and part in node
        is_index = isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)
        if is_key or is_index:
            node = node[part]
    if isinstance(node, dict) and loc and loc[-1] in node:
        del node[loc[-1]]
        return True
    return False
