"""Read a TOML (or JSON) file into a strict pydantic model, or fail in one line.

Manifests, pipeline specs and calibration recipes are all operator-written
files; a mistake in any of them gets the same treatment: the file, the first
bad field, and what to do.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, SecretStr, ValidationError

from edge_agent.errors import EdgeAgentError

Model = TypeVar("Model", bound=BaseModel)


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


def first_error(exc: ValidationError, prefix: str = "") -> tuple[str, str]:
    """The dotted place and the message of a validation error's first problem: what every
    one-line error about a bad field names (files, specs, commands, releases)."""
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"])
    return (f"{prefix}{where}" if where else prefix.rstrip(".") or "(top)"), first["msg"]


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
