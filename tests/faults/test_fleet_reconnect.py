"""The console's own link lost and back: what the broker did not send again is unknown.

On a resubscribe the broker sends every retained state it holds. A device whose state it
no longer holds (a restart without persistence, a state cleared while the console was
away) is not sent, and the console went on showing its old state as current, `online`.

The broker here keeps its retained messages over a restart (persistence), and a second
mosquitto on the same database clears one device's state while the console's broker is
down: when the console is back, the broker holds exactly one of the two states, whatever
the console's reconnect timing. The states are made and cleared by mosquitto_pub.
"""

from __future__ import annotations

import queue
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from edge_agent.comms.local_broker import LocalBroker
from edge_agent.comms.session import MqttSession, connect
from edge_agent.fleet.roster import DeviceRecord, Roster, unsettled
from tests.broker import TOPICS, broker_settings
from tests.integration.test_fleet_console import cells, lines_of, mosquitto_pub
from tests.retained_kit import cleared_while_away, kept_broker, until

BOXES = ("box-a", "box-b")


@pytest.fixture
def kept(tmp_path: Path) -> Iterator[LocalBroker]:
    """A broker that keeps its retained messages over a restart, in `tmp_path/db`."""
    with kept_broker(tmp_path) as running:
        yield running


def _born(broker: LocalBroker, device: str) -> None:
    body = {"online": True, "seq": 1, "ts": time.time(), "group": "docks"}
    mosquitto_pub(broker, TOPICS.device(device, "state"), body, retain=True)


def _record(roster: Roster, device: str) -> DeviceRecord:
    return next(r for r in roster.snapshot() if r.device == device)


def test_a_state_not_sent_again_after_a_reconnect_is_unknown_until_one_comes(
    kept: LocalBroker,
) -> None:
    for box in BOXES:
        _born(kept, box)
    roster = Roster(TOPICS)
    ever_unknown: set[str] = set()

    def look(_: object) -> None:
        ever_unknown.update(r.device for r in roster.snapshot() if r.unknown)

    def reconnected(comm: MqttSession) -> None:
        roster.on_connected(comm)
        look(comm)

    # Looked at where a flap would show: after the reconnect is taken in, and as each state
    # arrives, before the roster has it (subscribed first, this handler is called first).
    # A box-a marked before its retained state came back is seen there; one marked after
    # stays marked, as no other state of it comes.
    session = connect(broker_settings(kept), on_connected=reconnected)
    try:
        session.subscribe(TOPICS.device("+", "state"), look, qos=0)
        roster.follow(session)
        assert unsettled(session, TOPICS) is None
        assert roster.members("docks") == list(BOXES)
        cleared_while_away(kept, TOPICS.device("box-b", "state"))
        until(lambda: _record(roster, "box-b").unknown)
        a, b = _record(roster, "box-a"), _record(roster, "box-b")
        assert (a.unknown, a.online) == (False, True)
        assert b.online is False  # it held `online`, which nothing vouches for now
        # A group command must not count on it: it would be waited for and time out.
        assert roster.members("docks") == ["box-a"]
        _born(kept, "box-b")  # live, as a box's birth on its own reconnect
        until(lambda: not _record(roster, "box-b").unknown)
        assert _record(roster, "box-b").online
        assert roster.members("docks") == list(BOXES)
    finally:
        session.stop()
    assert ever_unknown == {"box-b"}


def test_a_fresh_console_has_nothing_to_mark(kept: LocalBroker) -> None:
    # Its first connect is no reconnect: every state it holds came on this link.
    _born(kept, "box-a")
    roster = Roster(TOPICS)
    session = connect(broker_settings(kept), on_connected=roster.on_connected)
    try:
        roster.follow(session)
        assert unsettled(session, TOPICS) is None
        [record] = roster.snapshot()
        assert (record.unknown, record.online) == (False, True)
    finally:
        session.stop()


def _row(lines: queue.Queue[str], device: str, timeout: float = 15.0) -> list[str]:
    """The cells of `device`'s next row that the watch prints."""
    deadline = time.monotonic() + timeout
    while True:
        line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        if line.startswith(f"│ {device} "):
            return cells(line)


def test_watch_shows_unknown_what_its_broker_did_not_send_again(kept: LocalBroker) -> None:
    for box in BOXES:
        _born(kept, box)
    # Piped, watch prints its table, then the rows of the devices whose standing changed.
    watching = subprocess.Popen(
        [sys.executable, "-m", "edge_agent.fleet.cli", "watch", "-p", str(kept.port)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    printed: list[str] = []
    try:
        assert watching.stdout is not None
        lines = lines_of(watching.stdout, printed)
        assert _row(lines, "box-a")[1] == "online"
        assert _row(lines, "box-b")[1] == "online"
        first_table = len(printed)
        cleared_while_away(kept, TOPICS.device("box-b", "state"))
        row = _row(lines, "box-b")
        assert row[1] == "unknown", row
        assert "unconfirmed since reconnect" in row, row
        _born(kept, "box-b")
        assert _row(lines, "box-b")[1] == "online"
    finally:
        watching.send_signal(signal.SIGTERM)
        _, err = watching.communicate(timeout=30)
    assert watching.returncode == 0, err
    # box-a came back with the retained states: its standing never changed, so its row was
    # never printed again (as unknown, or at all).
    assert [line for line in printed[first_table:] if "box-a" in line] == [], printed
