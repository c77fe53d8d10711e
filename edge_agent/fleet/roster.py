"""The whole fleet as a console sees it: every device's state and telemetry, and group commands.

A `Roster` follows `<prefix>/+/state` (retained: a console that connects learns
every device at once) and, for `watch`, `<prefix>/+/telemetry`. States obey the
`seq` rule of docs/PROTOCOL.md: a message whose connection sequence number is
older than the one held is a stale will (or a stale birth) and is ignored.

`send_group` sends one command on `<prefix>/group/<group>/cmd` and gathers the
answers of every member from `<prefix>/+/resp`, matched by the command's id.
"""

from __future__ import annotations

import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

from edge_agent.comms.base import Communicator, Message, Unsubscribe
from edge_agent.fleet.console import Interrupted, Replies, expiry_seconds, new_command, parse
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
    """One device as the roster holds it."""

    device: str
    state: msg.State | None
    telemetry: msg.Telemetry | None

    @property
    def online(self) -> bool:
        return self.state is not None and self.state.online

    @property
    def last_seen(self) -> float | None:
        """Unix seconds of the newest thing the device said (its own clock)."""
        times = [m.ts for m in (self.state, self.telemetry) if m is not None]
        return max(times) if times else None


class Roster:
    """Every device's latest state (by the seq rule) and telemetry; safe across threads."""

    def __init__(self, topics: Topics) -> None:
        self.topics = topics
        self.changed = threading.Event()
        self._lock = threading.Lock()
        self._states: dict[str, msg.State] = {}
        self._telemetry: dict[str, msg.Telemetry] = {}
        self.ignored_stale = 0

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

    def _device_of(self, topic: str) -> str:
        return topic[len(self.topics.prefix) + 1 :].split("/", 1)[0]

    def on_state(self, message: Message) -> None:
        device = self._device_of(message.topic)
        if not message.payload:  # a cleared retained state: the device was decommissioned
            with self._lock:
                self._states.pop(device, None)
                self._telemetry.pop(device, None)
            self.changed.set()
            return
        state = parse(msg.State, message.payload)
        if state is None:
            return
        with self._lock:
            if not accept_state(self._states.get(device), state):
                self.ignored_stale += 1
                return
            self._states[device] = state
        self.changed.set()

    def on_telemetry(self, message: Message) -> None:
        telemetry = parse(msg.Telemetry, message.payload)
        if telemetry is None:
            return
        with self._lock:
            self._telemetry[self._device_of(message.topic)] = telemetry
        self.changed.set()

    def snapshot(self) -> list[DeviceRecord]:
        """Every device heard of, by id."""
        with self._lock:
            names = sorted(set(self._states) | set(self._telemetry))
            return [
                DeviceRecord(name, self._states.get(name), self._telemetry.get(name))
                for name in names
            ]

    def members(self, group: str) -> list[str]:
        """The online devices whose birth says they are in `group`."""
        return [
            r.device
            for r in self.snapshot()
            if r.online and r.state is not None and r.state.group == group
        ]


def settle(comm: Communicator, topics: Topics, timeout: float = 5.0) -> bool:
    """Wait until the retained messages of the subscriptions made so far have arrived.

    A broker sends a subscription's retained messages before anything published after
    it, so a message this console publishes to itself comes back behind them.
    Returns False when it did not come back within `timeout`.
    """
    echo = topics.device("fleet", f"console/{uuid.uuid4().hex}")
    back = threading.Event()
    # At the QoS of the retained states it follows: a QoS 1 echo could pass them.
    undo = comm.subscribe(echo, lambda _message: back.set(), qos=FANIN_QOS)
    try:
        comm.publish(echo, b"", qos=1)
        return back.wait(timeout)
    finally:
        undo()


Outcome = Literal["ok", "error", "timeout"]


@dataclass
class DeviceResult:
    """How one device's part of a group command ended."""

    device: str
    outcome: Outcome
    answer: msg.Response | None = None
    """The final answer (ok or error); None on timeout."""
    progress: msg.Progress | None = None
    """The last progress it reported."""

    @property
    def result(self) -> dict[str, Any]:
        return (self.answer.result if self.answer else None) or {}


OnAnswer = Callable[[msg.Response], None]


def send_group(
    comm: Communicator,
    topics: Topics,
    group: str,
    kind: str,
    args: dict[str, Any] | None,
    members: Iterable[str],
    *,
    timeout: float,
    on_answer: OnAnswer | None = None,
    stop: threading.Event | None = None,
) -> dict[str, DeviceResult]:
    """Send one command to `group` and wait for the final answer of every member.

    Devices outside `members` that answer too (one came online meanwhile) are included.

    Raises:
        Interrupted: `stop` was set before every answer came.
    """
    results = {device: DeviceResult(device, "timeout") for device in members}
    replies = Replies()
    undo = comm.subscribe(topics.device("+", "resp"), replies.on_response, qos=FANIN_QOS)
    command = new_command(kind, args, timeout)
    answers = replies.expect(command.id)
    try:
        comm.publish(
            topics.group(group, "cmd"),
            command.model_dump_json().encode(),
            qos=1,
            expiry_s=expiry_seconds(timeout),
        )
        deadline = time.monotonic() + timeout
        while any(r.answer is None for r in results.values()):
            if stop is not None and stop.is_set():
                raise Interrupted(kind)
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                answer = answers.get(timeout=min(left, 0.5))
            except queue.Empty:
                continue
            entry = results.setdefault(answer.device_id, DeviceResult(answer.device_id, "timeout"))
            if answer.status == "progress":
                entry.progress = answer.progress
            elif answer.status in ("ok", "error"):
                entry.answer = answer
                entry.outcome = answer.status
            if on_answer is not None:
                on_answer(answer)
    finally:
        replies.forget(command.id)
        undo()
    return results
