"""docs/PROTOCOL.md and docs/schemas/ are what the models say, and the models read back what
the agent writes."""

from __future__ import annotations

import subprocess
import sys
import types
import typing
from pathlib import Path

from pydantic import BaseModel

from edge_agent.protocol import agent as msg
from edge_agent.protocol.agent import all_messages
from edge_agent.protocol.delivery import all_delivery_messages

ROOT = Path(__file__).resolve().parents[2]


def test_committed_schemas_and_tables_match_the_models() -> None:
    """A changed message, command or error code without `python tools/export_schemas.py`
    fails here, naming the stale files."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "export_schemas.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def _models(model: type[BaseModel], seen: set[type[BaseModel]]) -> None:
    if model in seen:
        return
    seen.add(model)
    for field in model.model_fields.values():
        for arg in _flatten(field.annotation):
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                _models(arg, seen)


def _flatten(annotation: object) -> list[object]:
    args = typing.get_args(annotation)
    if not args:
        return [annotation]
    return [a for arg in args for a in _flatten(arg)]


def _nullable(annotation: object) -> bool:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return type(None) in typing.get_args(annotation)
    if origin is typing.Annotated:
        return _nullable(typing.get_args(annotation)[0])
    return False


def test_every_nullable_field_has_a_default() -> None:
    """The agent publishes with exclude_none, so a field that may be None must be optional,
    or the fleet cannot read back the agent's own message (this was state.models.version)."""
    seen: set[type[BaseModel]] = set()
    for model in {**all_messages(), **all_delivery_messages()}.values():
        _models(model, seen)
    bad = [
        f"{model.__name__}.{name}"
        for model in seen
        for name, field in model.model_fields.items()
        if field.is_required() and _nullable(field.annotation)
    ]
    assert bad == []


def test_a_birth_message_written_without_nulls_reads_back() -> None:
    state = msg.State(
        online=True,
        seq=3,
        ts=1.0,
        models=[msg.ModelState(name="person-ssdlite", version=None, digest="ab")],
    )
    again = msg.State.model_validate_json(state.model_dump_json(exclude_none=True))
    assert again == state


def test_the_events_prose_names_every_agent_event_kind() -> None:
    # The list of agent events once left out model_swapped, which the agent sends.
    text = (ROOT / "docs" / "PROTOCOL.md").read_text()
    prose = text[text.index("## Events") : text.index("## Error codes")]
    kinds = typing.get_args(msg.AgentEvent.model_fields["kind"].annotation)
    assert [k for k in kinds if f"`{k}`" not in prose] == []


def test_the_docs_name_log_events_as_the_code_logs_them() -> None:
    # `event=release.unverified` in the docs; the code logs release_unverified.
    text = (ROOT / "docs" / "PROTOCOL.md").read_text()
    code = (ROOT / "edge_agent" / "store" / "release.py").read_text()
    assert '"release_unverified"' in code
    assert "event=release_unverified" in text
    assert "release.unverified" not in text
