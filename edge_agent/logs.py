"""The one logging set-up: one line per event, key=value for people or JSON for machines.

Code logs events, not sentences: `log_event(log, logging.INFO, "model_swapped",
pipeline="dock", old="a", new="b")` writes

    time=2025-01-01T12:00:00.000Z level=info logger=edge_agent.pipelines.vision
    event=model_swapped pipeline=dock old=a new=b

on one line, with a value quoted (JSON-style) when it holds a space, a quote, an
`=` or a control character, so a line always splits back into the same fields.
`log_context(command_id=...)` adds fields to every line logged inside it, so a
command's lines can be tied together. An expected failure (a sink's full disk, a
source that went away) is one `log_event` line naming the error; only a crash
(a bug) is logged with `log.exception` and keeps its traceback.

The CLI and the service call `setup_logging` once; library code only logs.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Hashable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any, Literal, TextIO

Format = Literal["kv", "json"]

CONTEXT_KEYS = ("pipeline", "model", "command_id")
"""Fields that tie lines together; they come first after the event, when present."""

_HANDLER_NAME = "edge-agent"
_context: ContextVar[Mapping[str, object] | None] = ContextVar(
    "edge_agent_log_context", default=None
)


def log_event(logger: logging.Logger, level: int, event: str, /, **fields: object) -> None:
    """Log one event as one line.

    Args:
        logger: The module's logger.
        level: A `logging` level, e.g. `logging.WARNING`.
        event: What happened, as a snake_case name (`sink_failed`, `source_live`).
        fields: Details; `pipeline`, `model` and `command_id` tie lines together.
    """
    if logger.isEnabledFor(level):
        logger.log(level, event, extra={"event": event, "fields": fields}, stacklevel=2)


def log_crash(logger: logging.Logger, event: str, /, **fields: object) -> None:
    """Log a bug caught in an `except` block: the event line, then the traceback.

    Only for what is not an operator's problem (those are one `log_event` line);
    the thread that caught it keeps serving.
    """
    logger.error(event, extra={"event": event, "fields": fields}, exc_info=True, stacklevel=2)


class Throttle:
    """Whether a line that repeats may be logged now: once per key every `every_s` seconds.

    A service that keeps failing the same way (a full disk, a broken sink, a damaged file)
    must say so without a -v, but must not fill the journal. Thread-safe.
    """

    def __init__(self, every_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s = every_s
        self._clock = clock
        self._last: dict[Hashable, float] = {}
        self._lock = threading.Lock()

    def ready(self, key: Hashable = None) -> bool:
        """True the first time for `key`, then once `every_s` has passed since it last was."""
        now = self._clock()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self.every_s:
                return False
            self._last[key] = now
            return True


@contextmanager
def log_context(**fields: object) -> Iterator[None]:
    """Add `fields` to every line logged by this thread (and tasks it starts) inside the block."""
    token = _context.set({**(_context.get() or {}), **fields})
    try:
        yield
    finally:
        _context.reset(token)


def error_text(exc: BaseException) -> str:
    """`OSError: [Errno 28] No space left on device`: the type says what kind of failure."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def record_fields(record: logging.LogRecord) -> dict[str, object]:
    """A record's fields in line order: time, level, logger, event, ids, details."""
    created = datetime.fromtimestamp(record.created, UTC)
    fields: dict[str, object] = {
        "time": created.strftime("%Y-%m-%dT%H:%M:%S.") + f"{created.microsecond // 1000:03d}Z",
        "level": record.levelname.lower(),
        "logger": record.name,
    }
    details: Mapping[str, object] = getattr(record, "fields", {})
    event = getattr(record, "event", None)
    if event is None:
        # A plain `log.info("...")`, ours or a library's: the message is its only detail.
        fields["event"] = "log"
        details = {"msg": record.getMessage()}
    else:
        fields["event"] = event
    merged = {**(_context.get() or {}), **details}
    for key in CONTEXT_KEYS:
        if key in merged:
            fields[key] = merged.pop(key)
    for key, value in merged.items():
        # A detail never overwrites the line's own time, level, logger or event.
        fields[key if key not in fields else f"field_{key}"] = value
    if record.exc_info and record.exc_info[1] is not None:
        fields["error"] = error_text(record.exc_info[1])
    return fields


def format_value(value: object) -> str:
    """A value as it appears after `key=`: bare when that is unambiguous, else JSON-quoted."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    text = str(value)
    if text and all(c.isprintable() and c not in ' "=\\' for c in text):
        return text
    quoted = json.dumps(text, ensure_ascii=False)
    # JSON escapes C0 only: DEL, C1 (0x9b is a CSI by itself) and bidirectional overrides
    # in a box's or a camera's words reached `journalctl -f` raw, for the terminal to obey.
    if quoted.isprintable():  # nearly always: one C-level pass, not one per character
        return quoted
    return "".join(c if c.isprintable() else json.dumps(c)[1:-1] for c in quoted)


def kv_line(fields: Mapping[str, object]) -> str:
    """`key=value key="quoted value"`, in the mapping's order."""
    return " ".join(f"{key}={format_value(value)}" for key, value in fields.items())


class KeyValueFormatter(logging.Formatter):
    """One `key=value` line per record; a crash's traceback follows on indented lines."""

    def format(self, record: logging.LogRecord) -> str:
        line = kv_line(record_fields(record))
        if record.exc_info and record.exc_info[1] is not None:
            trace = self.formatException(record.exc_info)
            line += "\n" + "\n".join("    " + ln for ln in trace.splitlines())
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per record; a crash's traceback is its `traceback` field."""

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] = record_fields(record)
        if record.exc_info and record.exc_info[1] is not None:
            fields["traceback"] = self.formatException(record.exc_info)
        return json.dumps(fields, ensure_ascii=False, default=str)


def verbosity_level(verbosity: int) -> int:
    """0 shows warnings and errors, 1 (`-v`) adds INFO, 2 (`-vv`) adds DEBUG."""
    return logging.WARNING if verbosity <= 0 else logging.INFO if verbosity == 1 else logging.DEBUG


def setup_logging(verbosity: int = 0, fmt: Format = "kv", stream: TextIO | None = None) -> None:
    """Send every log line, edge-agent's and its libraries', to `stream` in one format.

    Calling it again replaces the earlier set-up (a CLI flag can change it).

    Args:
        verbosity: 0 = WARNING, 1 = INFO, 2+ = DEBUG for edge-agent's own loggers;
            libraries stay at WARNING so their chatter never drowns ours.
        fmt: "kv" for key=value lines, "json" for JSON lines.
        stream: Where lines go; standard error when None.
    """
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(JsonFormatter() if fmt == "json" else KeyValueFormatter())
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == _HANDLER_NAME]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    logging.getLogger("edge_agent").setLevel(verbosity_level(verbosity))
