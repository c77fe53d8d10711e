"""edge-fleet's console parts that need no broker: the seq rule, arguments, group waits."""

from __future__ import annotations

import io
import json
import logging
import math
import threading
import time
from pathlib import Path
from typing import Literal

import pytest
from rich.console import Console
from rich.table import Table

from edge_agent.comms.base import Handler, Message
from edge_agent.comms.fake import FakeBroker
from edge_agent.errors import EdgeAgentError
from edge_agent.fleet import clock
from edge_agent.fleet.clock import skew_of_answer
from edge_agent.fleet.console import DeviceConsole, NoAnswerError
from edge_agent.fleet.console_cmd import (
    MAX_BARS,
    Bars,
    _fleet_line,
    _standing,
    command_args,
    parse_arg,
    screenful,
)
from edge_agent.fleet.group import DeviceResult, send_group
from edge_agent.fleet.roster import Roster
from edge_agent.fleet.tables import (
    age,
    printable,
    results_table,
    status_json,
    status_table,
    watch_json,
    watch_table,
)
from edge_agent.fleet.trouble import (
    SILENT_MIN_S,
    device_flags,
    in_trouble,
    next_silence,
    silent_at,
    silent_for,
)
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
    # Stopped, it returns what came (raised, Ctrl-C lost every answer gathered).
    stop = threading.Event()
    stop.set()
    started = time.monotonic()
    stopped = send_group(console, TOPICS, "docks", "ping", {}, ["b"], timeout=5.0, stop=stop)
    assert time.monotonic() - started < 2.0
    assert (stopped["b"].outcome, stopped["b"].answer) == ("interrupted", None)


def test_a_group_answer_counts_for_the_device_whose_topic_it_came_on_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # dock-2 may write only its own resp topic, but answered in dock-1's name there, and
    # `edge-fleet deploy --group` filed it under the device_id in its body: dock-1's
    # failed deploy read as ok.
    broker = FakeBroker()
    console, dock1, dock2 = broker.connect(), broker.connect(), broker.connect()

    def answer(device: str, as_device: str, status: Literal["ok", "error"]) -> Handler:
        def answered(message: Message) -> None:
            command = msg.Command.model_validate_json(message.payload)
            error = msg.ErrorBody(code="release.signature", message="untrusted")
            for said in ("accepted", status):
                reply = msg.Response(
                    id=command.id, status=said, device_id=as_device, ts=1.0,
                    result={"version": 1} if said == "ok" else None,
                    error=error if said == "error" else None,
                )  # fmt: skip
                session = dock1 if device == "dock-1" else dock2
                session.publish(TOPICS.device(device, "resp"), reply.model_dump_json().encode())

        return answered

    dock2.subscribe(TOPICS.group("docks", "cmd"), answer("dock-2", "dock-1", "ok"))  # first
    dock1.subscribe(TOPICS.group("docks", "cmd"), answer("dock-1", "dock-1", "error"))
    with caplog.at_level(logging.WARNING):
        results = send_group(
            console, TOPICS, "docks", "deploy_model", {"name": "m"}, ["dock-1"], timeout=0.3
        )
    assert sorted(results) == ["dock-1"]
    assert results["dock-1"].outcome == "error"
    said = [r for r in caplog.records if getattr(r, "event", None) == "fleet_answer_misnamed"]
    assert len(said) == 1  # two forged answers, said once
    assert said[0].fields == {  # type: ignore[attr-defined]
        "topic_device": "dock-2",
        "named": "dock-1",
        "detail": "dropped: an answer counts for the device whose resp topic it came on",
    }


def test_the_device_of_a_topic_is_its_first_level_below_the_prefix() -> None:
    assert TOPICS.device_of("edge/v1/dock-1/resp") == "dock-1"
    assert TOPICS.device_of("edge/v1/dock-1/results/cam") == "dock-1"
    assert Topics("site/a").device_of("site/a/dock-1/state") == "dock-1"
    for elsewhere in (
        "edge/v1/dock-1",
        "other/edge/v1/dock-1/resp",
        "edge/v2/x/resp",
        "edge/v1//resp",
    ):
        assert TOPICS.device_of(elsewhere) is None


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
        "4980 more not shown (0 of them offline, failing or flagged); "
        "--once S --json lists every device"
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


# --- what an operator paged at 3 a.m. must see ----------------------------------------------
NOW = 1_700_000_000.0
DAY = 86400.0


class Clock:
    """The console's clock, set by the test."""

    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def birth(
    device: str,
    ts: float,
    *,
    live: bool,
    online: bool = True,
    seq: int = 1,
    pipelines: list[msg.PipelineState] | None = None,
    models: list[msg.ModelState] | None = None,
    unverified: bool = False,
) -> Message:
    body = msg.State(
        online=online,
        seq=seq,
        ts=ts,
        pipelines=pipelines or [],
        models=models or [],
        unverified=unverified,
    )
    # A broker clears the retain flag of what it forwards live.
    return Message(TOPICS.device(device, "state"), body.model_dump_json().encode(), retain=not live)


def running(
    pipeline: str = "cam",
    status: Literal["starting", "running", "failed", "stopped"] = "running",
    detail: str = "",
) -> msg.PipelineState:
    return msg.PipelineState(id=pipeline, model="m", status=status, detail=detail)


def telemetry(
    device: str,
    ts: float,
    *,
    fps: float = 10.0,
    dropped: int = 0,
    outbox_dropped: int = 0,
    interval_s: float = 10.0,
    cpu_percent: float = 50.0,
    cpu_cores: int | None = None,
) -> Message:
    e2e = msg.StageTelemetry(count=10, p50_ms=100, p95_ms=120, p99_ms=130, max_ms=140)
    body = msg.Telemetry(
        ts=ts,
        interval_s=interval_s,
        pipelines={
            "cam": msg.PipelineTelemetry(
                fps=fps,
                frames=int(fps * interval_s),
                dropped_frames=dropped,
                stages={"end_to_end": e2e},
            )
        },
        models={},
        agent=msg.AgentTelemetry(
            cpu_percent=cpu_percent,
            cpu_cores=cpu_cores,
            rss_bytes=1,
            outbox_depth=0,
            outbox_bytes=0,
            outbox_dropped=outbox_dropped,
            reconnects=0,
            uptime_s=5,
        ),
    )
    return Message(TOPICS.device(device, "telemetry"), body.model_dump_json(by_alias=True).encode())


def rows_by_device(table: Table) -> dict[str, dict[str, str]]:
    """The first row of each device, by column header (cells as plain text)."""
    headers = [str(c.header) for c in table.columns]
    columns = [[str(cell) for cell in c.cells] for c in table.columns]
    found: dict[str, dict[str, str]] = {}
    for i, device in enumerate(columns[0]):
        if device:
            found[device] = {h: col[i] for h, col in zip(headers, columns, strict=True)}
    return found


def test_a_screenful_puts_flagged_devices_first_and_says_why() -> None:
    # Each of these listed below 40 healthy rows, and the caption said 0 were in trouble.
    console = Clock()
    roster = Roster(TOPICS, now=console)
    for i in range(40):
        roster.on_state(birth(f"a-{i:02d}", NOW - 60, live=False, pipelines=[running()]))
        roster.on_telemetry(telemetry(f"a-{i:02d}", NOW))
    troubled = {
        "z-camdead": telemetry("z-camdead", NOW, fps=0.0),  # running, no frame
        "z-dropping": telemetry("z-dropping", NOW, fps=5.0, dropped=50),
        "z-outbox": telemetry("z-outbox", NOW, outbox_dropped=5000),
    }
    for device, tele in troubled.items():
        roster.on_state(birth(device, NOW - 60, live=False, pipelines=[running()]))
        roster.on_telemetry(tele)
    # The outbox counter counts every drop ever: only its rise says it drops now.
    roster.on_telemetry(telemetry("z-outbox", NOW - 10, outbox_dropped=4000))  # older: ignored
    roster.on_telemetry(telemetry("z-outbox", NOW + 10, outbox_dropped=5200))
    roster.on_state(birth("a-steady", NOW - 60, live=False, pipelines=[running()]))
    roster.on_telemetry(telemetry("a-steady", NOW, outbox_dropped=900))
    roster.on_telemetry(telemetry("a-steady", NOW + 10, outbox_dropped=900))
    fallback = msg.ModelState(name="m", digest="x", device="CPU", fallback="NPU: no driver")
    roster.on_state(
        birth("z-trustless", NOW - 60, live=False, pipelines=[running()], unverified=True)
    )
    roster.on_state(birth("z-fellback", NOW - 60, live=False, models=[fallback]))
    console.now = NOW + 12

    table = watch_table(roster.snapshot(), now=console.now, limit=8)
    rows = rows_by_device(table)
    assert list(rows) == [
        "z-camdead",
        "z-fellback",
        "z-outbox",
        "z-trustless",
        "a-00",
        "a-01",
        "a-02",
        "a-03",
    ]
    assert {d: rows[d]["flags"] for d in rows if d.startswith("z-")} == {
        "z-camdead": "fps0",
        "z-fellback": "fallback",
        "z-outbox": "outbox-drops",
        "z-trustless": "unverified",
    }
    assert table.caption == (
        "38 more not shown (0 of them offline, failing or flagged); "
        "--once S --json lists every device"
    )
    # The same, for scripts: every device, flagged or not.
    listed = {entry["device"]: entry for entry in watch_json(roster.snapshot(), now=console.now)}
    assert listed["z-camdead"]["flags"] == ["cam: fps0"]
    assert listed["z-camdead"]["pipelines"]["cam"]["flags"] == ["fps0"]
    assert listed["z-camdead"]["in_trouble"] is True
    assert (listed["a-steady"]["flags"], listed["a-steady"]["in_trouble"]) == ([], False)
    # Dropped frames are shown, not trouble: a camera faster than its model drops by design,
    # and a fleet of those sorted first as failing.
    dropping = listed["z-dropping"]
    assert (dropping["flags"], dropping["in_trouble"]) == (["cam: drops 50%"], False)
    # Hidden ones are counted for what they are.
    hidden = watch_table(roster.snapshot(), now=console.now, limit=3)
    assert hidden.caption is not None
    assert "(1 of them offline, failing or flagged)" in hidden.caption


def test_why_a_pipeline_is_not_running_is_shown_in_status_and_watch() -> None:
    why = "no frame for 20 s [errno 111]: connection refused by 10.0.0.7:554, giving up"
    roster = Roster(TOPICS, now=Clock())
    roster.on_state(
        birth("dock-1", NOW, live=False, pipelines=[running("door", "failed", why), running()])
    )
    roster.on_state(birth("dock-2", NOW, live=False, pipelines=[running()]))
    out = Console(file=io.StringIO(), width=200)
    out.print(watch_table(roster.snapshot(), now=NOW))
    text = out.file.getvalue()  # type: ignore[attr-defined]
    door = next(line for line in text.splitlines() if "door" in line)
    assert door.endswith("│ no frame for 20 s [errno 111]: connection refus… │"), door
    # One line per pipeline, at fleet scale too: it is cut, in full in --json.
    assert len(text.splitlines()) == 8
    [listed, _] = watch_json(roster.snapshot(), now=NOW)
    assert listed["pipelines"]["door"]["detail"] == why

    out = Console(file=io.StringIO(), width=300)
    out.print(status_table(roster.snapshot(), now=NOW))
    row = next(line for line in out.file.getvalue().splitlines() if "dock-1" in line)  # type: ignore[attr-defined]
    # The box's words as they are: its brackets are not rich markup.
    assert "door failed: no frame for 20 s [errno 111]: connection refus…, cam running" in row
    assert "cam running │" in row


def test_an_offline_box_is_dated_by_what_the_console_knows() -> None:
    # The will is made at the connect: a box connected 30 days ago read "last seen 30d".
    console = Clock()
    roster = Roster(TOPICS, now=console)
    roster.on_state(birth("old-will", NOW - 30 * DAY, live=False, online=False))
    roster.on_state(birth("went-now", NOW - 30 * DAY, live=False))
    console.now = NOW + 5
    roster.on_state(birth("went-now", NOW - 30 * DAY, live=True, online=False))  # its will
    console.now = NOW + 125
    rows = rows_by_device(watch_table(roster.snapshot(), now=console.now))
    assert rows["old-will"]["last seen"] == "connected 30d ago"
    assert rows["went-now"]["last seen"] == "offline 2m"
    status = rows_by_device(status_table(roster.snapshot(), now=console.now))
    assert status["old-will"]["since"].startswith("connected 30d ago")
    listed = {entry["device"]: entry for entry in watch_json(roster.snapshot(), now=console.now)}
    assert (listed["went-now"]["last_seen"], listed["went-now"]["last_seen_from"]) == (
        NOW + 5,
        "arrival",
    )
    assert listed["old-will"]["last_seen_from"] == "device_clock"


def test_a_clock_far_off_is_flagged_and_never_dates_last_seen() -> None:
    console = Clock()
    roster = Roster(TOPICS, now=console)
    # Live births: made a moment before they arrived, so their ts says the skew, either way.
    roster.on_state(birth("ahead", NOW + 365 * DAY, live=True, pipelines=[running()]))
    roster.on_state(birth("behind", NOW - 3 * 3600, live=True, pipelines=[running()]))
    roster.on_state(birth("in-time", NOW - 0.4, live=True, pipelines=[running()]))
    # Retained: it may be old, so it says only that a clock is ahead, never behind.
    roster.on_state(birth("ahead-retained", NOW + 2 * DAY, live=False, pipelines=[running()]))
    roster.on_state(birth("old-retained", NOW - 9 * DAY, live=False, pipelines=[running()]))
    console.now = NOW + 40
    roster.on_telemetry(telemetry("ahead", NOW + 365 * DAY + 40))
    snapshot = roster.snapshot()
    rows = rows_by_device(watch_table(snapshot, now=console.now))
    assert {d: r["flags"] for d, r in rows.items()} == {
        "ahead": "clock +365d",
        "ahead-retained": "clock +2d",
        "behind": "clock -3h",
        "in-time": "",
        "old-retained": "",
    }
    # A year ahead read "last seen 0s" forever: the console's own arrival dates it.
    assert (rows["ahead"]["last seen"], rows["behind"]["last seen"]) == ("0s", "40s")
    status = rows_by_device(status_table(snapshot, now=console.now))
    assert (status["ahead-retained"]["since"], status["ahead-retained"]["flags"]) == (
        "?",
        "clock +2d",
    )
    assert status["old-retained"]["since"] == "9d"
    # A clock fixed after its birth: the next message corrects the estimate towards ahead.
    roster.on_telemetry(telemetry("behind", console.now + 1))
    assert rows_by_device(watch_table(roster.snapshot(), now=console.now))["behind"]["flags"] == ""


def test_an_answer_tells_the_skew_from_its_window() -> None:
    assert skew_of_answer(ts=105.0, sent=100.0, arrived=110.0) == 0.0  # made in between
    assert skew_of_answer(ts=110.0 + DAY, sent=100.0, arrived=110.0) == DAY
    assert skew_of_answer(ts=100.0 - 7200, sent=100.0, arrived=110.0) == -7200


def test_status_marks_a_fallback_and_a_box_that_trusts_no_key() -> None:
    models = [
        msg.ModelState(
            name="person-ssdlite", version=3, digest="x", device="CPU", fallback="NPU: no driver"
        ),
        msg.ModelState(name="orient", digest="y", device="GPU"),  # an agent before `backend`
        msg.ModelState(name="orient", digest="y", device="CPU", backend="onnxruntime"),
    ]
    roster = Roster(TOPICS, now=Clock())
    roster.on_state(birth("dock-1", NOW, live=False, models=models, unverified=True))
    [row] = rows_by_device(status_table(roster.snapshot(), now=NOW)).values()
    assert row["models"] == (
        "person-ssdlite v3 @CPU (fallback), orient @GPU, orient @CPU onnxruntime"
    )
    assert row["flags"] == "unverified, fallback"
    # The same for scripts, beside the state they come from.
    [entry] = status_json(roster.snapshot())
    assert (entry["device"], entry["flags"]) == ("dock-1", ["unverified", "fallback"])
    assert entry["unverified"] is True


def test_replayed_telemetry_does_not_pass_for_current() -> None:
    # After an outage the outbox sends what it kept, oldest first; a fresh interval may
    # have gone ahead of it. The roster kept whatever arrived last.
    console = Clock()
    roster = Roster(TOPICS, now=console)
    roster.on_state(birth("dock-1", NOW, live=True, pipelines=[running()]))  # the reconnect
    roster.on_telemetry(telemetry("dock-1", NOW - 900, fps=9.0))
    roster.on_telemetry(telemetry("dock-1", NOW - 890, fps=8.0))
    [record] = roster.snapshot()
    assert record.telemetry is not None
    assert record.telemetry.ts == NOW - 890
    [row] = rows_by_device(watch_table(roster.snapshot(), now=NOW)).values()
    assert row["flags"] == "replaying 15m behind"
    roster.on_telemetry(telemetry("dock-1", NOW + 10, fps=3.0))  # a fresh interval ...
    roster.on_telemetry(telemetry("dock-1", NOW - 880, fps=7.0))  # ... passed by the backlog
    [listed] = watch_json(roster.snapshot(), now=console.now)
    assert listed["pipelines"]["cam"]["fps"] == 3.0
    assert listed["flags"] == []
    assert roster.ignored_older_telemetry == 1


def test_the_fake_broker_sets_retain_only_on_what_comes_from_its_store() -> None:
    # As mosquitto does, and as the roster reads it to tell a live birth from a stored one:
    # the fake once passed the publisher's flag on to live subscribers.
    broker = FakeBroker()
    live: list[Message] = []
    broker.connect().subscribe("edge/v1/+/state", live.append)
    broker.connect().publish("edge/v1/b1/state", b"{}", retain=True)
    stored: list[Message] = []
    broker.connect().subscribe("edge/v1/+/state", stored.append)
    assert [m.retain for m in live] == [False]
    assert [m.retain for m in stored] == [True]


def test_a_box_restarted_while_watched_is_not_taken_for_replaying() -> None:
    # The telemetry held was from before the restart's birth arrived: compared on the box's
    # stamps alone, every box restarted in a rolling upgrade read "replaying 2m behind".
    console = Clock(NOW - 100)
    roster = Roster(TOPICS, now=console)
    roster.on_state(birth("dock-1", NOW - 200, live=True, pipelines=[running()]))
    roster.on_telemetry(telemetry("dock-1", NOW - 100))
    console.now = NOW  # 90 s dark, then the restart's birth, before its first interval
    roster.on_state(birth("dock-1", NOW, live=True, seq=2, pipelines=[running()]))
    [listed] = watch_json(roster.snapshot(), now=console.now)
    assert (listed["flags"], listed["in_trouble"]) == ([], False)
    # Telemetry made before that birth and arriving after it is the outbox's backlog.
    console.now = NOW + 1
    roster.on_telemetry(telemetry("dock-1", NOW - 95))
    [listed] = watch_json(roster.snapshot(), now=console.now)
    assert listed["flags"] == ["replaying 2m behind"]


def test_a_state_stamped_infinity_does_not_end_watch_or_status() -> None:
    # JSON takes Infinity and so does the model: round(inf) ended the console.
    roster = Roster(TOPICS, now=Clock())
    topic = TOPICS.device("odd", "state")
    roster.on_state(Message(topic, b'{"online": true, "seq": 1, "ts": Infinity}'))
    roster.on_state(birth("dock-1", NOW, live=True, pipelines=[running()]))
    listed = {entry["device"]: entry for entry in watch_json(roster.snapshot(), now=NOW)}
    assert set(listed) == {"odd", "dock-1"}
    out = Console(file=io.StringIO(), width=200)
    out.print(watch_table(roster.snapshot(), now=NOW))
    out.print(status_table(roster.snapshot(), now=NOW))


def test_status_tells_builds_of_one_version_apart_and_reads_boxes_without_a_build() -> None:
    roster = Roster(TOPICS)
    for device, build in (("new", "c23cb3843fd7"), ("old", None)):
        body = msg.State(online=True, seq=1, ts=NOW, agent_version="0.1.0", agent_build=build)
        payload = body.model_dump_json(exclude_none=True).encode()
        roster.on_state(Message(TOPICS.device(device, "state"), payload, retain=True))
    rows = rows_by_device(status_table(roster.snapshot(), now=NOW))
    assert (rows["new"]["agent"], rows["old"]["agent"]) == ("0.1.0 c23cb3843fd7", "0.1.0")


# A title change, a clipboard write (OSC 52), a screen clear and colour; a bell, an 8-bit CSI.
ESCAPES = "\x1b]0;owned\x1b\\\x1b]52;c;ZWNobw==\x07\x1b[2J\x1b[31m\x9b2J\x07"


def _controls(text: str) -> list[str]:
    return [c for c in text if (c < " " and c != "\n") or "\x7f" <= c <= "\x9f"]


def test_a_boxs_own_words_reach_the_terminal_without_control_characters(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A box's state (its own to write, under any ACL) set the operator's terminal title,
    # wrote to the clipboard and cleared the screen through `edge-fleet status`.
    evil = f"ALL{ESCAPES}GOOD"
    roster = Roster(TOPICS)
    body = msg.State(
        online=True, seq=1, ts=NOW, agent_version=evil, group=evil,
        models=[msg.ModelState(name=evil, version=1, digest="x", device=evil, fallback=evil)],
        pipelines=[msg.PipelineState(id=evil, model=evil, status="failed", detail=evil)],
    )  # fmt: skip
    device = f"box{ESCAPES}"  # a topic level may hold them too
    roster.on_state(Message(TOPICS.device(device, "state"), body.model_dump_json().encode()))
    roster.on_telemetry(telemetry(device, NOW))
    error = msg.ErrorBody(code=evil, message=evil, field=evil)
    failed = msg.Response(id="c", status="error", device_id=device, ts=NOW, error=error)
    done = msg.Response(
        id="c", status="ok", device_id=device, ts=NOW,
        result={"version": evil, "activated": True, "pipelines_swapped": [evil]},
    )  # fmt: skip
    out = Console(file=io.StringIO(), width=400, force_terminal=False, color_system=None)
    out.print(status_table(roster.snapshot(), now=NOW))
    out.print(watch_table(roster.snapshot(), now=NOW))
    out.print(
        results_table(
            "deploy",
            [DeviceResult(device, "error", failed), DeviceResult(f"{device}2", "ok", done)],
        )
    )
    bars = Bars(Console(file=io.StringIO(), force_terminal=False))
    bars.update(device, msg.Progress(stage=evil, fraction=0.5))
    shown = out.file.getvalue()  # type: ignore[attr-defined]
    assert shown.count("GOOD") >= 10  # every one of its words is still shown
    assert _controls(shown) == []
    err = capsys.readouterr().err
    assert "GOOD" in err
    assert _controls(err) == []
    # One line: a tab or a newline is a space; the rest goes.
    assert printable(f"a\tb\n{ESCAPES}c") == "a b ]0;owned\\]52;c;ZWNobw==[2J[31m2Jc"
    # Bidirectional overrides: shown, U+202E turned a box's "gnissim" into "missing".
    assert printable("ok \u202egnissim\u202c \u2067x\u2069 \u200fy") == "ok gnissim x y"


def test_an_agent_that_takes_its_cpus_is_flagged_beside_its_drops() -> None:
    # 18 cameras on a 2-core box: every pipeline dropped 41-48% and nothing said why.
    roster = Roster(TOPICS, now=Clock())
    cases = {
        "full": telemetry("full", NOW, fps=8.0, dropped=70, cpu_percent=192.0, cpu_cores=2),
        "busy": telemetry("busy", NOW, cpu_percent=170.0, cpu_cores=2),  # 85%: room left
        "older": telemetry("older", NOW, cpu_percent=192.0),  # an agent that sends no cores
    }
    for device, tele in cases.items():
        roster.on_state(birth(device, NOW - 60, live=False, pipelines=[running()]))
        roster.on_telemetry(tele)
    listed = {entry["device"]: entry for entry in watch_json(roster.snapshot(), now=NOW)}
    assert listed["full"]["flags"] == ["cpu 96%", "cam: drops 47%"]
    # A note, as drops are: a box running flat out on uncapped pipelines is by design.
    assert listed["full"]["in_trouble"] is False
    assert listed["busy"]["flags"] == []
    assert listed["older"]["flags"] == []
    rows = rows_by_device(watch_table(roster.snapshot(), now=NOW + 1))
    assert rows["full"]["flags"] == "cpu 96%, drops 47%"


def test_an_online_box_heard_live_then_not_for_three_intervals_is_flagged_silent() -> None:
    # Its will comes when the broker notices the lost link, not when the broker restarted
    # without its sessions: a watch showed such boxes green, with their last FPS, for hours.
    console = Clock()
    roster = Roster(TOPICS, now=console)
    roster.on_state(birth("dock-1", NOW - 60, live=False, pipelines=[running()]))
    roster.on_telemetry(telemetry("dock-1", NOW, interval_s=10.0))  # arrives at NOW
    roster.on_state(birth("dock-slow", NOW - 60, live=False, pipelines=[running()]))
    roster.on_telemetry(telemetry("dock-slow", NOW, interval_s=60.0))
    roster.on_state(birth("dock-gone", NOW - 60, live=False, online=False))
    roster.on_state(birth("dock-retained", NOW - 3 * DAY, live=False))
    snapshot = {r.device: r for r in roster.snapshot()}

    def flags(device: str, now: float) -> list[str]:
        return device_flags(snapshot[device], now)

    # Three intervals, at least a minute: a late interval or two is no silence.
    assert flags("dock-1", NOW + 59) == []
    assert flags("dock-1", NOW + 61) == ["silent 1m"]
    assert in_trouble(snapshot["dock-1"], NOW + 61)
    assert not in_trouble(snapshot["dock-1"], NOW + 59)
    assert flags("dock-slow", NOW + 170) == []
    assert flags("dock-slow", NOW + 190) == ["silent 3m"]
    # Offline says it already, and a box known only retained (`status`) was never heard.
    assert flags("dock-gone", NOW + DAY) == []
    assert flags("dock-retained", NOW + DAY) == []
    listed = {e["device"]: e for e in watch_json(roster.snapshot(), now=NOW + 3600)}
    assert listed["dock-1"]["flags"] == ["silent 1h"]
    assert listed["dock-1"]["in_trouble"] is True


def test_the_watch_says_when_the_consoles_own_link_is_down() -> None:
    roster = Roster(TOPICS, now=Clock())
    roster.on_state(birth("dock-1", NOW, live=False, pipelines=[running()]))
    assert watch_table(roster.snapshot(), now=NOW).caption is None
    lost = time.mktime((2023, 11, 14, 22, 13, 20, 0, 0, -1))
    down = watch_table(roster.snapshot(), now=NOW, offline_since=lost)
    assert (
        down.caption == "[red]this console lost the broker at 22:13:20: the table is as of then[/]"
    )


def test_a_command_started_without_a_final_answer_is_said_to_be_maybe_running() -> None:
    # A deploy that answered accepted and progress, then nothing within the wait, was
    # reported as "no answer, check the agent is running": the operator sent it again,
    # or met its activation later.
    broker = FakeBroker()
    console, device = broker.connect(), broker.connect()

    def started(message: Message) -> None:
        command = msg.Command.model_validate_json(message.payload)
        for status, progress in (
            ("accepted", None),
            ("progress", msg.Progress(stage="pull", fraction=0.8)),
        ):
            reply = msg.Response(
                id=command.id, status=status, device_id="a", ts=1.0, progress=progress
            )
            device.publish(TOPICS.device("a", "resp"), reply.model_dump_json().encode())

    device.subscribe(TOPICS.device("a", "cmd"), started)
    with pytest.raises(NoAnswerError) as info:
        DeviceConsole(console, TOPICS, "a", follow=False).request("deploy_model", {}, timeout=0.3)
    said = str(info.value)
    [command] = [m for m in broker.published if m.topic.endswith("/cmd")]
    sent_id = msg.Command.model_validate_json(command.payload).id
    assert f"a started it (id {sent_id}, last at pull 80%)" in said
    assert "it may still be running there" in said
    assert f"edge-fleet cmd a cancel --arg id={sent_id}" in said
    # One that never started is what it was: no answer, so check the agent.
    with pytest.raises(NoAnswerError, match=r"no answer from b within 0\.3 s"):
        DeviceConsole(console, TOPICS, "b", follow=False).request("ping", {}, timeout=0.3)


def test_a_deploy_answer_with_a_malformed_swap_list_is_shown_not_fatal() -> None:
    # A box answered `"pipelines_swapped": 3`: joining it ended `edge-fleet deploy` in a
    # traceback after the deploy had run, and a string was listed letter by letter.
    def answered(swapped: object) -> DeviceResult:
        result = {"version": 2, "activated": True, "pipelines_swapped": swapped}
        done = msg.Response(id="c", status="ok", device_id="a", ts=NOW, result=result)
        return DeviceResult("a", "ok", done)

    shown = {}
    for swapped in (3, "cam", {"cam": 1}, None, [], ["cam", "door"]):
        out = Console(file=io.StringIO(), width=200, color_system=None)
        out.print(results_table("deploy", [answered(swapped)]))
        shown[repr(swapped)] = out.file.getvalue()  # type: ignore[attr-defined]
    for malformed in ("3", "'cam'", "{'cam': 1}"):
        assert "activated, swapped: malformed" in shown[malformed], shown[malformed]
    for unswapped in ("None", "[]"):
        assert "activated " in shown[unswapped].replace("│", " ")
        assert "swapped" not in shown[unswapped]
    assert "activated, swapped cam, door" in shown["['cam', 'door']"]


def test_a_live_watch_fits_the_terminal_caption_and_all() -> None:
    # Cut by devices, not lines: 16 boxes of three cameras drew 48 rows on a 24-line
    # terminal, and the caption (how many are hidden, a lost link) fell off its foot.
    roster = Roster(TOPICS, now=Clock())
    cams = [running("cam"), running("door"), running("yard")]
    for i in range(40):
        roster.on_state(birth(f"box-{i:02d}", NOW - 60, live=False, pipelines=cams))
    roster.on_state(birth("box-gone", NOW - 60, live=False, online=False, pipelines=cams))
    for width, height in ((200, 24), (200, 12), (70, 30)):
        out = Console(file=io.StringIO(), width=width, height=height, color_system=None)
        out.print(screenful(out, roster.snapshot(), offline_since=NOW))
        lines = out.file.getvalue().splitlines()  # type: ignore[attr-defined]
        shown = "\n".join(lines)
        assert len(lines) <= height, (width, height, shown)
        assert "box-gone" in shown  # in trouble: first
        assert "lost the broker" in shown
        assert "more not shown" in shown.replace("\n", " ")
        # Every row it has room for is used: at most one device's rows are left unused.
        assert len(lines) >= height - len(cams), (width, height, shown)


@pytest.mark.parametrize("ts", [math.inf, -math.inf, math.nan, 1e300, -1e300, 1e18])
def test_a_time_no_calendar_holds_is_none_not_a_traceback(ts: float) -> None:
    assert clock.calendar(ts) is None


def test_a_time_the_calendar_holds_is_the_local_date_and_time() -> None:
    assert clock.calendar(0.0) == time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(0.0))


def test_a_state_not_sent_again_after_a_reconnect_reads_unknown_everywhere() -> None:
    # The fake broker routes at once: the echo is back, and the burst over, as
    # on_connected returns, with none of the states held sent again.
    roster = Roster(TOPICS)
    comm = FakeBroker().connect()
    roster.on_connected(comm)  # the first connect: nothing held, nothing to mark
    roster.on_state(state("a", True, 1, "docks"))
    roster.on_state(state("b", False, 1, "docks"))
    assert not any(r.unknown for r in roster.snapshot())
    roster.on_connected(comm)
    a, b = roster.snapshot()
    assert (a.unknown, a.online, b.unknown, b.online) == (True, False, True, False)
    assert roster.members("docks") == []
    assert device_flags(a, now=NOW)[0] == "unconfirmed since reconnect"
    assert in_trouble(a, now=NOW)
    assert [entry["online"] for entry in watch_json([a, b], now=NOW)] == [None, None]
    out = Console(file=io.StringIO(), width=240)
    out.print(watch_table([a, b], now=NOW), status_table([a, b], now=NOW))
    assert out.file.getvalue().count(" unknown ") == 4  # type: ignore[attr-defined]
    assert "0 online, 0 offline, 2 unknown," in _fleet_line([a, b], NOW, None, [])
    roster.on_state(state("a", True, 1, "docks"))  # the same connection: still news of it
    assert (roster.snapshot()[0].unknown, roster.members("docks")) == (False, ["a"])
    assert "1 online, 0 offline, 1 unknown," in _fleet_line(roster.snapshot(), NOW, None, [])


def test_the_next_silence_is_when_the_first_box_heard_live_passes_its_due() -> None:
    # A piped watch prints at a change; silence is the one flag time alone sets, so it
    # looks again then, and only then, rather than at every tick.
    roster = Roster(TOPICS, now=Clock())
    roster.on_state(birth("dock-1", NOW - 60, live=False, pipelines=[running()]))
    roster.on_telemetry(telemetry("dock-1", NOW, interval_s=10.0))  # arrives at NOW
    roster.on_state(birth("dock-retained", NOW - DAY, live=False))
    records = roster.snapshot()
    assert next_silence(records, NOW) == NOW + 60  # three intervals, at least a minute
    assert next_silence(records, NOW, silent_min_s=5) == NOW + 30  # three intervals
    # Silent already: only a message ends it, and the message says so itself.
    assert next_silence(records, NOW + 61) is None
    dock = records[0]
    assert silent_at(dock, 5) == NOW + 30
    assert silent_for(dock, NOW + 30, 5) is None  # due, not yet past it
    assert silent_for(dock, NOW + 31, 5) == 31


def test_a_piped_watch_stands_on_a_boxs_trouble_flags_not_on_their_figures() -> None:
    # A box already in trouble that gained a flag stood as before, and a piped watch never
    # printed it again; the figures beside a flag move every interval and must not count.
    console = Clock()
    roster = Roster(TOPICS, now=console)
    roster.on_state(birth("dock-1", NOW + 3600, live=True, pipelines=[running()]))
    roster.on_telemetry(telemetry("dock-1", NOW + 3600))

    def standing() -> object:
        (record,) = roster.snapshot()
        return _standing(record, console.now, SILENT_MIN_S)

    (record,) = roster.snapshot()
    assert device_flags(record, console.now) == ["clock +1h"]
    clock_only = standing()
    roster.on_telemetry(telemetry("dock-1", NOW + 3600, fps=0.0))
    assert standing() != clock_only  # gained `cam: fps0`, in trouble before and after
    dead_camera = standing()
    console.now = NOW + 61
    silent = standing()
    assert silent != dead_camera  # gained `silent`
    console.now = NOW + 200
    (record,) = roster.snapshot()
    assert "silent 3m" in device_flags(record, console.now)
    assert standing() == silent  # `silent 1m` to `silent 3m`: the same flags
    roster.on_telemetry(telemetry("dock-1", NOW + 3800 + 2 * DAY))
    (record,) = roster.snapshot()
    assert device_flags(record, console.now)[0] == "clock +2d"
    assert standing() == clock_only  # lost `fps0` and `silent`; `clock +2d` is `clock`
