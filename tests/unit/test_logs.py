"""The one logging set-up: key=value and JSON lines, quoting, ids, levels, tracebacks."""

from __future__ import annotations

import io
import json
import logging
import shlex
from collections.abc import Iterator

import pytest

from edge_agent.logs import (
    Throttle,
    format_value,
    log_context,
    log_crash,
    log_event,
    setup_logging,
)


@pytest.fixture
def stream() -> Iterator[io.StringIO]:
    out = io.StringIO()
    root = logging.getLogger()
    before = (list(root.handlers), root.level, logging.getLogger("edge_agent").level)
    yield out
    for handler in root.handlers[:]:
        if handler not in before[0]:
            root.removeHandler(handler)
    root.setLevel(before[1])
    logging.getLogger("edge_agent").setLevel(before[2])


def fields_of(line: str) -> dict[str, str]:
    # JSON string quoting is a subset of what a shell splits back, for these values.
    return dict(part.split("=", 1) for part in shlex.split(line))


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("dock", "dock"),
        ("", '""'),
        ("two words", '"two words"'),
        ('say "hi"', '"say \\"hi\\""'),
        ("a=b", '"a=b"'),
        ("line\nbreak", '"line\\nbreak"'),
        ("C:\\path", '"C:\\\\path"'),
        (3, "3"),
        (0.25, "0.25"),
        (True, "true"),
        (None, "null"),
        ("café", "café"),
        ("esc\x1b[2J", '"esc\\u001b[2J"'),
        ("csi\x9b2J del\x7f", '"csi\\u009b2J del\\u007f"'),
        ("rtl\u202egnissim", '"rtl\\u202egnissim"'),
    ],
)
def test_values_are_bare_only_when_unambiguous(value: object, text: str) -> None:
    assert format_value(value) == text


def test_key_value_line_has_ids_first_and_splits_back(stream: io.StringIO) -> None:
    setup_logging(1, "kv", stream)
    log = logging.getLogger("edge_agent.pipelines.test")
    with log_context(command_id="c-42"):
        log_event(log, logging.INFO, "model_swapped", old="a b", model="face", pipeline="dock")
    line = stream.getvalue()
    assert line.count("\n") == 1
    keys = [part.split("=", 1)[0] for part in shlex.split(line)]
    assert keys == [
        "time", "level", "logger", "event", "pipeline", "model", "command_id", "old",
    ]  # fmt: skip
    fields = fields_of(line)
    assert fields["level"] == "info"
    assert fields["event"] == "model_swapped"
    assert fields["old"] == "a b"
    assert fields["command_id"] == "c-42"
    assert fields["time"].endswith("Z")


def test_json_lines_carry_the_same_fields(stream: io.StringIO) -> None:
    setup_logging(0, "json", stream)
    log = logging.getLogger("edge_agent.pipelines.test")
    log_event(log, logging.WARNING, "sink_failed", pipeline="dock", error='x "y"\nz', failures=3)
    record = json.loads(stream.getvalue())
    assert record["event"] == "sink_failed"
    assert record["level"] == "warning"
    assert record["error"] == 'x "y"\nz'
    assert record["failures"] == 3


def test_verbosity_gates_info_and_debug(stream: io.StringIO) -> None:
    log = logging.getLogger("edge_agent.pipelines.test")
    setup_logging(0, "kv", stream)
    log_event(log, logging.INFO, "source_live", pipeline="dock")
    assert stream.getvalue() == ""
    setup_logging(1, "kv", stream)  # calling again replaces, never doubles, the handler
    log_event(log, logging.INFO, "source_live", pipeline="dock")
    log_event(log, logging.DEBUG, "frame", pipeline="dock")
    assert [fields_of(ln)["event"] for ln in stream.getvalue().splitlines()] == ["source_live"]
    setup_logging(2, "kv", stream)
    log_event(log, logging.DEBUG, "frame", pipeline="dock")
    assert stream.getvalue().splitlines()[-1].endswith("event=frame pipeline=dock")


def test_libraries_stay_at_warning(stream: io.StringIO) -> None:
    setup_logging(2, "kv", stream)
    # paho: a library that logs through the root (NNCF keeps a handler of its own once
    # imported, which calibrate_cmd sends to stderr).
    logging.getLogger("paho.mqtt.client").info("progress 10%")
    logging.getLogger("paho.mqtt.client").warning("a real problem")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1
    assert fields_of(lines[0])["msg"] == "a real problem"
    assert fields_of(lines[0])["event"] == "log"


def test_a_crash_keeps_its_traceback_an_error_event_does_not(stream: io.StringIO) -> None:
    setup_logging(0, "kv", stream)
    log = logging.getLogger("edge_agent.pipelines.test")
    log_event(log, logging.ERROR, "source_error", pipeline="dock", error="stream ended early")
    assert stream.getvalue().count("\n") == 1
    try:
        raise ZeroDivisionError("division by zero")
    except ZeroDivisionError:
        log_crash(log, "emitter_crashed", pipeline="dock")
    crash = stream.getvalue().splitlines()[1:]
    assert fields_of(crash[0])["event"] == "emitter_crashed"
    assert 'error="ZeroDivisionError: division by zero"' in crash[0]
    assert any("Traceback" in ln for ln in crash[1:])
    assert all(ln.startswith("    ") for ln in crash[1:])


def test_a_detail_cannot_overwrite_the_line_s_own_fields(stream: io.StringIO) -> None:
    setup_logging(0, "kv", stream)
    log_event(logging.getLogger("edge_agent.x"), logging.WARNING, "odd", level="custom")
    fields = fields_of(stream.getvalue())
    assert fields["level"] == "warning"
    assert fields["field_level"] == "custom"


def test_throttle_lets_a_key_through_once_per_period() -> None:
    now = [100.0]
    throttle = Throttle(60.0, clock=lambda: now[0])
    assert throttle.ready("disk")  # the first time, always
    assert not throttle.ready("disk")
    assert throttle.ready("sink")  # each key on its own
    now[0] += 59.9
    assert not throttle.ready("disk")
    now[0] += 0.1
    assert throttle.ready("disk")
    assert not throttle.ready("disk")
    assert throttle.ready()  # no key: one line for the whole
