"""Export the wire protocol from the pydantic models, so docs/PROTOCOL.md cannot drift.

Writes
- docs/schemas/<Name>.json: a JSON Schema (draft 2020-12, as pydantic makes it) for every
  agent message and command's arguments (protocol/agent.py), every delivery message
  (protocol/delivery.py) and the signed release (store/release.py);
- the generated blocks of docs/PROTOCOL.md, between `<!-- BEGIN GENERATED: x -->` and
  `<!-- END GENERATED: x -->`: the command table (type, answers, arguments) and the
  error-code table (errors.CODES).

    python tools/export_schemas.py           # write them
    python tools/export_schemas.py --check   # exit 1, naming what is stale (the tests do this)
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[1]
SCHEMAS = ROOT / "docs" / "schemas"
PROTOCOL = ROOT / "docs" / "PROTOCOL.md"


def models() -> dict[str, type[BaseModel]]:
    """Every message model on the wire, by schema file name."""
    from edge_agent.protocol.agent import all_messages
    from edge_agent.protocol.delivery import all_delivery_messages
    from edge_agent.store.release import SignedRelease

    found: dict[str, type[BaseModel]] = dict(all_messages())
    found.update(all_delivery_messages())
    found["release.SignedRelease"] = SignedRelease
    return found


def schema_texts() -> dict[str, str]:
    """File name -> JSON text, stable (sorted keys, 2-space indent, newline at the end)."""
    texts = {}
    for name, model in sorted(models().items()):
        schema: dict[str, Any] = model.model_json_schema(mode="validation")
        schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}
        texts[f"{name}.json"] = json.dumps(schema, indent=2, sort_keys=True) + "\n"
    return texts


def _type_of(prop: dict[str, Any]) -> str:
    if "type" in prop:
        kind = prop["type"]
        if kind == "array" and "items" in prop and "type" in prop["items"]:
            return f"array of {prop['items']['type']}"
        return str(kind)
    if "anyOf" in prop:
        return " or ".join(_type_of(p) for p in prop["anyOf"])
    if "$ref" in prop:
        return str(prop["$ref"]).rsplit("/", 1)[-1]
    return "any"


_NO_ARGS = {
    "ping": "answers `{pong: true, ts}`: the round trip, nothing else.",
    "get_status": "versions, models (device, precision, fallback), pipelines, MQTT link, "
    "outbox, running jobs.",
    "doctor": "what `edge-agent doctor --json` says: engines, devices, drivers, cache.",
    "list_models": "installed versions (current, previous), the reference models, and "
    "`damaged`: the store files that do not read, when any.",
    "list_pipelines": "the pipelines and their status.",
}
"""What the commands without arguments answer (their args model is the shared NoArgs)."""


def _limits(prop: dict[str, Any]) -> str:
    found = [
        f"{word} {prop[key]}"
        for key, word in (
            ("minimum", ">="),
            ("exclusiveMinimum", ">"),
            ("maximum", "<="),
            ("exclusiveMaximum", "<"),
        )
        if key in prop
    ]
    for option in prop.get("anyOf", []):
        found += [_limits(option)] if _limits(option) else []
    return ", ".join(found)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def commands_table() -> str:
    """Markdown: each command type, how it is answered, and its arguments."""
    from edge_agent.protocol.agent import COMMAND_ARGS, LONG_COMMANDS

    lines = [
        "| type | answers | arguments (`args`) |",
        "|---|---|---|",
    ]
    for kind, model in COMMAND_ARGS.items():
        answers = "accepted, progress..., ok or error" if kind in LONG_COMMANDS else "ok or error"
        schema = model.model_json_schema(mode="validation")
        required = set(schema.get("required", []))
        args = []
        for field, prop in schema.get("properties", {}).items():
            flag = (
                "required" if field in required else f"default `{json.dumps(prop.get('default'))}`"
            )
            limits = _limits(prop)
            kind_text = _type_of(prop) + (f" {limits}" if limits else "")
            args.append(f"`{field}` ({kind_text}, {flag}): {prop.get('description', '')}")
        summary = _NO_ARGS.get(kind) or (model.__doc__ or "").strip().splitlines()[0]
        summary = summary.split(": ", 1)[-1] if kind not in _NO_ARGS else summary
        body = "<br>".join(args) if args else "none"
        lines.append(f"| `{kind}` | {answers} | {_cell(summary)}<br>{_cell(body)} |")
    return "\n".join(lines)


def codes_table() -> str:
    """Markdown: every stable error code and what it means."""
    from edge_agent.errors import CODES

    lines = ["| code | meaning |", "|---|---|"]
    lines += [f"| `{code}` | {_cell(text)} |" for code, text in CODES.items()]
    return "\n".join(lines)


def schemas_list() -> str:
    """Markdown: the schema files and the model each comes from."""
    lines = []
    for name, model in sorted(models().items()):
        doc = (model.__doc__ or "").strip().splitlines()[0]
        lines.append(f"- [`{name}.json`](schemas/{name}.json): {_cell(doc)}")
    return "\n".join(lines)


BLOCKS = {"commands": commands_table, "error-codes": codes_table, "schemas": schemas_list}


def _constant(block: str) -> Callable[[re.Match[str]], str]:
    # A function, not the string: re.sub would read backslashes in a string replacement.
    def replace(_: re.Match[str]) -> str:
        return block

    return replace


def render_protocol(text: str) -> str:
    """PROTOCOL.md with every generated block filled in from the code."""
    for name, make in BLOCKS.items():
        begin = f"<!-- BEGIN GENERATED: {name} -->\n"
        end = f"<!-- END GENERATED: {name} -->"
        pattern = re.compile(f"{re.escape(begin)}.*?{re.escape(end)}", re.DOTALL)
        text = pattern.sub(_constant(f"{begin}{make()}\n{end}"), text)
    return text


def stale() -> list[str]:
    """What on disk differs from the models (empty when all is current)."""
    found = []
    wanted = schema_texts()
    for name, text in wanted.items():
        path = SCHEMAS / name
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            found.append(str(path.relative_to(ROOT)))
    if SCHEMAS.is_dir():
        found += [
            str(p.relative_to(ROOT)) + " (no model)"
            for p in sorted(SCHEMAS.glob("*.json"))
            if p.name not in wanted
        ]
    if PROTOCOL.is_file():
        current = PROTOCOL.read_text(encoding="utf-8")
        if render_protocol(current) != current:
            found.append(str(PROTOCOL.relative_to(ROOT)) + " (generated blocks)")
    else:
        found.append(str(PROTOCOL.relative_to(ROOT)) + " (missing)")
    return found


def write() -> list[str]:
    """Write the schemas and the generated blocks; returns what changed."""
    changed = stale()
    SCHEMAS.mkdir(parents=True, exist_ok=True)
    wanted = schema_texts()
    for name, text in wanted.items():
        (SCHEMAS / name).write_text(text, encoding="utf-8")
    for path in SCHEMAS.glob("*.json"):
        if path.name not in wanted:
            path.unlink()
    if PROTOCOL.is_file():
        current = PROTOCOL.read_text(encoding="utf-8")
        PROTOCOL.write_text(render_protocol(current), encoding="utf-8")
    return changed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="only check; exit 1 if stale")
    args = parser.parse_args()
    if args.check:
        found = stale()
        for item in found:
            print(f"stale: {item}", file=sys.stderr)
        if found:
            print("run: python tools/export_schemas.py", file=sys.stderr)
        return 1 if found else 0
    for item in write():
        print(f"wrote {item}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
