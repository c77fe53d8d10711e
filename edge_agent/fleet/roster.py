"""The whole fleet as a console sees it: every device's state and telemetry, and group commands.

A `Roster` follows `<prefix>/+/state` (retained: a console that connects learns
every device at once) and, for `watch`, `<prefix>/+/telemetry`. States obey the
`seq` rule of docs/PROTOCOL.md: a message whose connection sequence number is
older than the one held is a stale will (or a stale birth) and is ignored.
Telemetry is kept only when it is newer than what is held: after an outage a box
replays its outbox oldest first. The roster also notes when messages arrived on the
console's clock, which dates what a box's own `ts` cannot (a will is made at the
connect; a clock a year ahead makes everything look fresh), and estimates each box's
clock skew from it (fleet/clock.py).

When the console's own link comes back, the broker sends every retained state again, and
only those: a device whose state it no longer holds (a broker restarted without
persistence, a state cleared while the console was away) is not sent, and its old state
showed as current. So every state held at the reconnect waits to be confirmed by one that
arrives again, retained or live; those still waiting once the retained burst is over are
marked (`DeviceRecord.stale_since`) until a state of theirs comes. See `on_connected`.

Group commands, which send to the members a roster knows, are `fleet.group`'s.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

from edge_agent.comms.base import Communicator, Message, Unsubscribe, last_refusal, refusals
from edge_agent.fleet import clock
from edge_agent.fleet.console import parse
from edge_agent.fleet.recheck import Recheck
from edge_agent.protocol import agent as msg
from edge_agent.protocol.topics import FANIN_QOS, Topics


def accept_state(held: msg.State | None, new: msg.State) -> bool:
    """Whether `new` replaces `held` (the seq rule, pure).

    A newer connection always wins. The same connection's messages replace each other
    in arrival order (a re-birth, then its clean-stop offline message). An older
    connection's message, typically the will of a connection that died just before a
    fast restart, is ignored.
    """
    return held is None or new.seq >= held.seq


@dataclass(frozen=True)
class DeviceRecord:
    """One device as the roster holds it.

    Times named `*_arrived` are the console's clock when a message arrived live; a
    retained message (what a console learns as it connects) has none: it may be a month
    old, and only the box's own `ts` dates it.
    """

    device: str
    state: msg.State | None
    telemetry: msg.Telemetry | None
    state_arrived: float | None = None
    """When the held state arrived live (console clock); None when it came retained."""
    telemetry_arrived: float | None = None
    """When the held telemetry arrived (console clock)."""
    outbox_dropped_before: int | None = None
    """The outbox's dropped counter in the telemetry held before this one: the counter
    counts every drop ever, so only its rise says the box is dropping now."""
    skew_s: float | None = None
    """Box clock minus console clock, as far as its messages tell (see fleet.clock)."""
    stale_since: float | None = None
    """When this console found, after its own reconnect, that the broker no longer holds
    this device's state (console clock): the state held is the last known, not the current
    one. None while it holds, and again once a state of the device arrives."""

    @property
    def unknown(self) -> bool:
        """Whether the state held is no longer vouched for (see `stale_since`)."""
        return self.stale_since is not None

    @property
    def online(self) -> bool:
        """Its state says online, and is still the broker's: an unknown one is not online,
        or a group command counted it in and waited for its answer."""
        return self.state is not None and self.state.online and not self.unknown

    @property
    def last_heard(self) -> float | None:
        """Console time of the newest message that arrived live, None if none did."""
        times = [t for t in (self.state_arrived, self.telemetry_arrived) if t is not None]
        return max(times) if times else None

    @property
    def last_seen(self) -> float | None:
        """When the device last said something: the console's arrival time when one is
        known, else its state's `ts`, unless its clock is known to be off (then None).
        For an offline device heard of only retained, that `ts` is when it connected (the
        will is made at the connect) or when it stopped cleanly, not when it went away."""
        heard = self.last_heard
        if heard is not None:
            return heard
        if self.state is None or clock.off(self.skew_s):
            return None
        return self.state.ts


def accept_telemetry(held: DeviceRecord | None, new: msg.Telemetry) -> bool:
    """Whether `new` replaces the telemetry held (pure).

    After an outage a box sends what its outbox kept, oldest first, and a fresh interval
    may pass the backlog: only a newer `ts` replaces what is held, or the old figures
    would show as current. One exception: a held telemetry from a clock that was ahead
    (its `ts` past its arrival) would otherwise hide the box's until its clock catches up.
    """
    if held is None or held.telemetry is None:
        return True
    if new.ts > held.telemetry.ts:
        return True
    arrived = held.telemetry_arrived
    return arrived is not None and held.telemetry.ts - arrived > clock.CLOCK_TOLERANCE_S


def echo_topic(topics: Topics) -> str:
    """A topic of this console's own, to send itself an echo on (see `unsettled`)."""
    return topics.device("fleet", f"console/{uuid.uuid4().hex}")


class Roster:
    """Every device's latest state (by the seq rule) and telemetry; safe across threads.

    Args:
        topics: The fleet's topic prefix.
        now: The console's clock, read when a message arrives (a test's own, there).
    """

    def __init__(self, topics: Topics, now: Callable[[], float] = time.time) -> None:
        self.topics = topics
        self.changed = threading.Event()
        self._now = now
        self._lock = threading.Lock()
        self._records: dict[str, DeviceRecord] = {}
        self.ignored_stale = 0
        self.ignored_older_telemetry = 0
        # The devices whose state has not come again since the last reconnect. At the QoS
        # of the states it follows: a QoS 1 echo could pass them.
        self._recheck = Recheck(self._lock, self._unconfirmed_gone, qos=FANIN_QOS)

    def on_connected(self, comm: Communicator) -> None:
        """To be called on every connect of the session the roster follows, before that
        link's messages are handled: `MqttSession`'s `on_connected` is, on the thread that
        then hands over the messages.

        Every state held then awaits a state of its device on the new link; a device still
        waiting once the roster's echo is back behind the retained states has no state on
        the broker (`stale_since`). How, and why an echo rather than a settle window:
        fleet/recheck.py. A device whose retained state does come is never marked.
        A fresh console holds nothing at its first connect: there is nothing to mark.
        """

        def held() -> set[str]:
            return {d for d, r in self._records.items() if r.state is not None}

        self._recheck.reconnected(comm, echo_topic(self.topics), held)

    def _unconfirmed_gone(self, devices: set[str]) -> None:
        """The retained states have all come: mark the devices still waiting. Holding the
        lock (`Recheck`)."""
        now = self._now()
        for device in devices:
            record = self._records.get(device)
            if record is not None and record.stale_since is None:
                self._records[device] = replace(record, stale_since=now)
        self.changed.set()

    def follow(self, comm: Communicator, *, telemetry: bool = False) -> list[Unsubscribe]:
        """Subscribe to every device's state (and telemetry), at QoS 0 (`FANIN_QOS`)."""
        state = self.topics.device("+", "state")
        undo = [comm.subscribe(state, self.on_state, qos=FANIN_QOS)]
        if telemetry:
            undo.append(
                comm.subscribe(
                    self.topics.device("+", "telemetry"), self.on_telemetry, qos=FANIN_QOS
                )
            )
        return undo

    def on_state(self, message: Message) -> None:
        arrived = self._now()
        device = self.topics.device_of(message.topic)
        if device is None:
            return
        if not message.payload:  # a cleared retained state: the device was decommissioned
            with self._lock:
                self._records.pop(device, None)
                self._recheck.heard(device)
            self.changed.set()
            return
        state = parse(msg.State, message.payload)
        if state is None:
            return
        # A broker clears the retain flag of what it forwards live: with it set, the
        # message was stored before this console subscribed, and its arrival dates nothing.
        live = not message.retain
        with self._lock:
            held = self._records.get(device)
            if not accept_state(held.state if held else None, state):
                self.ignored_stale += 1
                return
            skew = clock.skew_after(
                held.skew_s if held else None,
                state.ts,
                arrived,
                live_birth=live and state.online,
            )
            record = held or DeviceRecord(device, None, None)
            # Only a state taken confirms one: an older seq than held is no news of it.
            self._recheck.heard(device)
            self._records[device] = replace(
                record,
                state=state,
                state_arrived=arrived if live else None,
                skew_s=skew,
                stale_since=None,
            )
        self.changed.set()

    def on_telemetry(self, message: Message) -> None:
        arrived = self._now()
        telemetry = parse(msg.Telemetry, message.payload)
        device = self.topics.device_of(message.topic)
        if telemetry is None or device is None:
            return
        with self._lock:
            held = self._records.get(device)
            if not accept_telemetry(held, telemetry):
                self.ignored_older_telemetry += 1
                return
            record = held or DeviceRecord(device, None, None)
            before = record.telemetry.agent.outbox_dropped if record.telemetry else None
            self._records[device] = replace(
                record,
                telemetry=telemetry,
                telemetry_arrived=arrived,
                outbox_dropped_before=before,
                skew_s=clock.skew_after(record.skew_s, telemetry.ts, arrived, live_birth=False),
            )
        self.changed.set()

    def snapshot(self) -> list[DeviceRecord]:
        """Every device heard of, by id."""
        with self._lock:
            return [self._records[name] for name in sorted(self._records)]

    def members(self, group: str) -> list[str]:
        """The online devices whose birth says they are in `group`; after a reconnect, only
        those whose state has come again (the others may be gone: waited for, they would
        read as time-outs)."""
        with self._lock:
            return [
                r.device
                for name, r in sorted(self._records.items())
                if r.online
                and r.state is not None
                and r.state.group == group
                and not self._recheck.waiting(name)
            ]


@dataclass(frozen=True)
class Unsettled:
    """Why a console cannot tell that every retained state has come."""

    code: Literal["broker.refused", "broker.unreachable"]
    why: str
    """In words for the operator's terminal."""


def unsettled(comm: Communicator, topics: Topics, timeout: float = 5.0) -> Unsettled | None:
    """Wait until the retained messages of the subscriptions made so far have arrived: None
    once they have, else why not.

    A broker sends a subscription's retained messages before anything published after
    it, so a message this console publishes to itself comes back behind them.

    A user who may read the fleet but not write `<prefix>/fleet/console/#` has its echo
    refused (MQTT 5) in a round trip: that is said at once, with the fix, rather than
    waited out and put down to a broker that did not answer.
    """
    echo = echo_topic(topics)
    back = threading.Event()
    # At the QoS of the retained states it follows: a QoS 1 echo could pass them.
    undo = comm.subscribe(echo, lambda _message: back.set(), qos=FANIN_QOS)
    try:
        refused = refusals(comm)
        comm.publish(echo, b"", qos=1)
        deadline = time.monotonic() + timeout
        while not back.wait(min(0.1, max(0.0, deadline - time.monotonic()))):
            if refusals(comm) > refused:
                return Unsettled(
                    "broker.refused",
                    f"the broker refused this console's echo ({last_refusal(comm)}), by which "
                    "it knows every retained state has come: let its user write "
                    f"{topics.prefix}/fleet/console/# (`fleet` in systemd/mosquitto/fleet.acl "
                    "may)",
                )
            if time.monotonic() >= deadline:
                return Unsettled(
                    "broker.unreachable", f"the broker did not answer within {timeout:g} s"
                )
        return None
    finally:
        undo()
