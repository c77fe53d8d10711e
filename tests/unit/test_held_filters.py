"""The held-filters record: whatever is on disk, the session starts; a refusing disk is logged."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from edge_agent.comms.held_filters import MAX_FILTERS, HeldFilters, is_valid_filter


def test_saved_filters_load_back(tmp_path: Path) -> None:
    record = HeldFilters(tmp_path / "state" / "mqtt-filters.json")
    assert record.load() == []  # nothing saved yet
    record.save(["a/cmd", "fleet/releases/x/chunks"])
    assert record.load() == ["a/cmd", "fleet/releases/x/chunks"]
    assert [p.name for p in (tmp_path / "state").iterdir()] == ["mqtt-filters.json"]


@pytest.mark.parametrize(
    "content",
    [b"", b"{not json", b'{"a": 1}', b"\xff\xfe", b'"a/cmd"'],
    ids=["empty", "garbled", "object", "not utf-8", "string"],
)
def test_an_unusable_file_is_an_empty_record_and_a_warning(
    tmp_path: Path, content: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "mqtt-filters.json"
    path.write_bytes(content)
    with caplog.at_level(logging.WARNING):
        assert HeldFilters(path).load() == []
    assert "held_filters_unreadable" in caplog.text


def test_only_valid_filters_are_taken_once_each_and_bounded(tmp_path: Path) -> None:
    path = tmp_path / "mqtt-filters.json"
    many = [f"t/{i}" for i in range(MAX_FILTERS + 10)]
    path.write_text(json.dumps(["a", 1, None, "", "a", "x" * 70000, "b", *many]))
    loaded = HeldFilters(path).load()
    assert loaded[:3] == ["a", "b", "t/0"]
    assert len(loaded) == MAX_FILTERS


def test_a_disk_that_refuses_is_logged_and_never_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    record = HeldFilters(blocker / "mqtt-filters.json")  # its folder cannot be made
    with caplog.at_level(logging.WARNING):
        record.save(["a"])
        record.save(["b"])
    assert caplog.text.count("held_filters_not_saved") == 1  # once a minute, not per save
    assert record.load() == []


@pytest.mark.parametrize(
    ("topic_filter", "valid"),
    [
        ("edge/v1/dock-7/cmd", True),
        ("edge/+/x", True),
        ("edge/#", True),
        ("#", True),
        ("+", True),
        ("$share/g/edge/v1/x", True),
        ("", False),
        ("a/#/b", False),
        ("a#", False),
        ("a/+x", False),
        ("a\0b", False),
        ("\ud800", False),
        ("x" * 65536, False),
        (7, False),
    ],
)
def test_filters_are_checked_as_a_broker_would(topic_filter: object, valid: bool) -> None:
    assert is_valid_filter(topic_filter) is valid


def test_filters_a_broker_would_refuse_are_skipped_on_load(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A malformed filter in an UNSUBSCRIBE makes mosquitto drop the link on every connect,
    # and a lone surrogate (valid JSON) raises inside paho: neither may reach the session.
    path = tmp_path / "mqtt-filters.json"
    path.write_text('["a/#/b", "\\ud800", "a\\u0000b", "keep/+/x"]')
    with caplog.at_level(logging.WARNING):
        assert HeldFilters(path).load() == ["keep/+/x"]
    [line] = [r for r in caplog.records if r.getMessage() == "mqtt.held_filters_invalid"]
    assert line.fields == {"path": str(path), "skipped": 3}  # type: ignore[attr-defined]
