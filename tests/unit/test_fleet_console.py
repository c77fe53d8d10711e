"""edge-fleet's console parts that need no broker: the seq rule, arguments, group waits."""

from __future__ import annotations

import io
import json
import threading
import time
from pathlib import Path

import pytest
from rich.console import Console

from edge_agent.comms.base import Message
from edge_agent.comms.fake import FakeBroker
from edge_agent.errors import EdgeAgentError
from edge_agent.fleet.console import Interrupted
from edge_agent.fleet.console_cmd import MAX_BARS, Bars, command_args, parse_arg
from edge_agent.fleet.roster import Roster, send_group
from edge_agent.fleet.tables import age, watch_table
from edge_agent.protocol import agent as msg
from edge_agent.protocol.topics import Topics

TOPICS = Topics()


def state(device: str, online: bool, seq: int, group: str | None = None) -> Message:
    body = msg.State(online=online, seq=seq, ts=1000.0 + seq, group=group)
    return Message(TOPICS.device(device, "state"), body.model_dump_json().encode(), retain=True)


def test_a_stale_will_does_not_mark_a_restarted_device_offline() -> None:
    roster = Roster(TOPICS)
    roster.on_state(state("a", True, 7))
    roster.on_state(state("a", True, 8))  # a fast restart: the new birth first ...
    roster.on_state(state("a", False, 7))  # ... then the old connection's will
    [record] = roster.snapshot()
    assert (record.online, record.state and record.state.seq) == (True, 8)
    assert roster.ignored_stale == 1
    roster.on_state(state("a", False, 8))  # this connection's clean stop counts
    assert roster.snapshot()[0].online is False


def test_a_cleared_state_forgets_the_device_and_garbage_is_ignored() -> None:
    roster = Roster(TOPICS)
    roster.on_state(state("a", True, 1, "docks"))
    roster.on_state(state("b", True, 1, "yard"))
    roster.on_state(state("c", False, 1, "docks"))
    roster.on_state(Message(TOPICS.device("b", "state"), b"{not json", retain=True))
    assert roster.members("docks") == ["a"]  # c is offline
    roster.on_state(Message(TOPICS.device("a", "state"), b"", retain=True))
    assert [r.device for r in roster.snapshot()] == ["b", "c"]


def test_arguments_are_json_when_they_parse_and_strings_otherwise(tmp_path: Path) -> None:
    assert parse_arg("version=3") == ("version", 3)
    assert parse_arg("activate=false") == ("activate", False)
    assert parse_arg('spec={"id": "cam"}') == ("spec", {"id": "cam"})
    assert parse_arg("name=person-det") == ("name", "person-det")
    assert parse_arg('name="3"') == ("name", "3")  # quoted: a string after all
    assert parse_arg("data=a=b") == ("data", "a=b")
    with pytest.raises(EdgeAgentError) as caught:
        parse_arg("version")
    assert caught.value.code == "input.invalid"

    toml = tmp_path / "args.toml"
    toml.write_text('name = "orient"\nversion = 2\n', encoding="utf-8")
    assert command_args(["version=3"], toml) == {"name": "orient", "version": 3}
    plain = tmp_path / "args"
    plain.write_text(json.dumps({"id": "cam"}), encoding="utf-8")
    assert command_args([], plain) == {"id": "cam"}
    plain.write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(EdgeAgentError, match="not a JSON object or a TOML table"):
        command_args([], plain)


def test_a_group_command_waits_for_every_member_and_times_out_the_silent() -> None:
    broker = FakeBroker()
    console = broker.connect()
    device = broker.connect()

    def answer(message: Message) -> None:
        command = msg.Command.model_validate_json(message.payload)
        for status in ("accepted", "ok"):
            reply = msg.Response(
                id=command.id, status=status, device_id="a", ts=1.0, result={"pong": True}
            )
            device.publish(TOPICS.device("a", "resp"), reply.model_dump_json().encode())

    device.subscribe(TOPICS.group("docks", "cmd"), answer)
    seen: list[str] = []
    results = send_group(
        console,
        TOPICS,
        "docks",
        "ping",
        {},
        ["a", "b"],
        timeout=0.3,
        on_answer=lambda r: seen.append(r.status),
    )
    assert (results["a"].outcome, results["a"].result) == ("ok", {"pong": True})
    assert (results["b"].outcome, results["b"].answer) == ("timeout", None)
    assert seen == ["accepted", "ok"]
    stop = threading.Event()
    stop.set()
    with pytest.raises(Interrupted, match="ping"):
        send_group(console, TOPICS, "docks", "ping", {}, ["b"], timeout=5.0, stop=stop)


def test_ages_read_short() -> None:
    assert [age(t, now=100_000.0) for t in (99_996.0, 99_700.0, 92_000.0, 1.0, None)] == [
        "4s",
        "5m",
        "2h",
        "1d",
        "-",
    ]


def test_a_screenful_of_a_large_fleet_shows_the_devices_in_trouble_first() -> None:
    # 5,000 boxes by name: box-04321, offline, was thousands of rows below the screen.
    roster = Roster(TOPICS)
    for i in range(5000):
        roster.on_state(state(f"box-{i:05d}", i not in (4321, 4999), 1))
    table = watch_table(roster.snapshot(), now=2000.0, limit=20)
    devices = list(table.columns[0].cells)
    assert devices[:2] == ["box-04321", "box-04999"]
    assert devices[2:] == [f"box-{i:05d}" for i in range(18)]
    assert table.caption == (
        "4980 more not shown (0 of them offline or failing); --once S --json lists every device"
    )
    assert len(list(watch_table(roster.snapshot(), now=2000.0).columns[0].cells)) == 5000


def test_progress_of_a_large_group_is_one_line_by_stage(capsys: pytest.CaptureFixture[str]) -> None:
    bars = Bars(Console(file=io.StringIO(), force_terminal=False), summary_every_s=3600.0)
    for i in range(3):  # a few devices: a line per device and step
        bars.update(f"dock-{i}", msg.Progress(stage="transfer", fraction=0.5))
    assert capsys.readouterr().err.splitlines() == [f"dock-{i}: transfer 50%" for i in range(3)]
    for i in range(5000):  # a fleet: one line for all, now and then
        stage = "install" if i % 4 == 0 else "transfer"
        bars.update(f"box-{i}", msg.Progress(stage=stage, fraction=0.9 if i % 4 == 0 else 0.5))
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 + MAX_BARS - 3, lines  # 9 boxes by line, then the summary
    assert lines[-1] == "13 devices: 3 install, 10 transfer (59% on average)"
    bars.close()


def test_a_large_group_on_a_terminal_is_one_bar() -> None:
    bars = Bars(Console(file=io.StringIO(), force_terminal=True))
    try:
        for i in range(MAX_BARS):
            bars.update(f"dock-{i}", msg.Progress(stage="transfer", fraction=0.25))
        assert bars._progress is not None
        assert len(bars._progress.tasks) == MAX_BARS
        for i in range(2000):
            bars.update(f"box-{i}", msg.Progress(stage="install", fraction=0.75))
        time.sleep(0.3)  # the group's bar is summed at most every 0.25 s
        bars.update("box-0", msg.Progress(stage="install", fraction=0.75))
        [task] = bars._progress.tasks
        assert task.description.startswith(f"{2000} install, {MAX_BARS} transfer")
        assert task.completed == pytest.approx((2000 * 0.75 + MAX_BARS * 0.25) / (2000 + MAX_BARS))
    finally:
        bars.close()
