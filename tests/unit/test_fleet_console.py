"""edge-fleet's console parts that need no broker: the seq rule, arguments, group waits."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from edge_agent.comms.base import Message
from edge_agent.comms.fake import FakeBroker
from edge_agent.errors import EdgeAgentError
from edge_agent.fleet.console import Interrupted
from edge_agent.fleet.console_cmd import command_args, parse_arg
from edge_agent.fleet.roster import Roster, send_group
from edge_agent.fleet.tables import age
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
