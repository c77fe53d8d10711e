"""The outbox pump: one thread moving the outbox to the broker.

In the outbox's order, deleting a message only once the broker has acknowledged it, with
two exceptions for a console that is waiting now, each found through an index so a
backlog of any size costs the same per batch:
- command answers go ahead of everything (`Outbox.peek_answers`): after an outage the
  backlog drains at the broker's pace, and an answer at its end kept a console waiting
  past its timeout for a command the box had already run;
- the newest telemetry goes ahead of a backlog (`Outbox.newest`): it says what is so now,
  and a console keeps only the telemetry with the newest `ts`. Older telemetry keeps its
  place: after an outage it is the history of the outage, sent in order.

What is in flight (handed to the session, not yet acknowledged) is bounded by bytes:
the link's round trip plus about `_WINDOW_S` of the acknowledgement rate the pump
measures, so on a slow uplink an answer waits behind that much at most. With 200 results
in flight at 16 KB/s, a ping waited 4.2 s (26-29 s at 2.5 KB/s, near `edge-fleet cmd`'s
30 s timeout), and telemetry, in line behind every result, reached the console minutes
old. On a LAN the bound is `_PUMP_BATCH` messages, as before: the rate measured there
allows far more.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from edge_agent.comms.session import MqttSession
from edge_agent.outbox import Outbox, Priority, Queued
from edge_agent.outbox.outbox import MOVE_EVERY_S

_PUMP_BATCH = 200
"""The most messages in flight, however fast the link."""
_WINDOW_S = 0.5
"""How long what is in flight should queue beyond the link's round trip, at the rate
measured: what an answer or a fresh telemetry waits behind. Each batch waits for its last
acknowledgement before the next one goes, so the window covers the round trip too (the
quickest batch of late, `_RTT_KEPT`): sized by the rate alone, it shrank each batch on a
link whose round trip neared 0.5 s (satellite, a congested cell) to its floor, 4 KB a
round trip however fast the link, where 200 messages a batch had kept up."""
_RTT_KEPT = 16
"""Batches whose completion times give the round trip (their minimum)."""
_WINDOW_MIN_BYTES = 4096
"""The least in flight, whatever was measured (an outage or a stall makes one batch look
slow): a dozen results, a quarter of a second at 16 KB/s."""
_GATHER_S = 0.02
"""How long the pump lets results and telemetry gather before it sends them. One message a
wake-up cost a thread hop, an outbox read, a flush wait and an acknowledgement each: at
200 results a second that was most of what the agent adds to a pipeline's CPU
(tools/bench_agent.py). Answers and events are not held: they cut the wait short."""
_ANSWER_POLL_S = 0.05
"""While a batch is in flight, how often the pump looks for an answer to send behind it."""
_OFFLINE_POLL_S = 1.0
"""The same while the link is down: nothing goes until it is back, and an idle box's CPU
should stay in its deep sleep states through an outage."""
_STOP_FLUSH_S = 2.0
"""At a stop, how long what is in flight may take to be acknowledged; what is not stays in
the outbox for the next start."""
_PUMP_IDLE_S = 5.0
"""How long the pump sleeps with nothing to send: every put, connect and stop wakes it, so
this is only a safety net for a wake-up that never comes."""


class OutboxPump:
    """Moves `outbox` to `session` until `stop` is set and nothing is in flight.

    Args:
        wake: Set by every put, connect and stop.
        urgent: Set by every answer or event put: they are not held to gather others.
        failed: Called from the `except` block of a pass that failed (a disk that cannot be
            read now), with the step's name; the pump tries again a second later.
    """

    def __init__(
        self,
        outbox: Outbox,
        session: MqttSession,
        *,
        wake: threading.Event,
        urgent: threading.Event,
        stop: threading.Event,
        failed: Callable[[str], None],
    ) -> None:
        self._outbox = outbox
        self._session = session
        self._wake = wake
        self._urgent = urgent
        self._stop = stop
        self._failed = failed
        self._sent = _Sent()
        self._window = _WINDOW_MIN_BYTES
        """Bytes that may be in flight: measured at each acknowledged batch that filled it."""
        self._took: deque[float] = deque(maxlen=_RTT_KEPT)
        """How long recent batches took to be acknowledged: the least is the round trip."""
        self.beat = time.monotonic()
        """When a step of the pump last began: every step ends within seconds (its longest
        wait is _PUMP_IDLE_S), so an old one is a pump stuck, though its thread lives."""

    def run(self) -> None:
        """The pump thread's body: returns once stopped with nothing left in flight (or
        nothing acknowledged within `_STOP_FLUSH_S`)."""
        while not self._stop.is_set() or self._sent.in_flight:
            self.beat = time.monotonic()
            try:
                if not self._once():
                    return
            except Exception:
                # A disk that cannot be read now may be readable in a second; a dead pump
                # would leave everything on disk while the agent looks well.
                self._failed("pump")
                if self._stop.wait(1.0):
                    return

    def _once(self) -> bool:
        """One step of the pump; False when it should end."""
        sent = self._sent
        if sent.in_flight:
            return self._settle()
        if not self._outbox.on_disk and time.monotonic() >= sent.next_move:
            # Tried here, with nothing in flight: the move gives what waits new sequence
            # numbers, so the pump's place starts over (the file's older messages go first).
            sent.next_move = time.monotonic() + MOVE_EVERY_S
            if self._outbox.move_to_disk():
                sent.upto = sent.telemetry_ahead = 0
                sent.early.clear()
        if not self._session.connected.is_set():
            self._wake.wait(_PUMP_IDLE_S)  # the connect wakes it
            self._wake.clear()
            return True
        self._urgent.clear()
        stopping = self._stop.is_set()
        ahead = self._answers()
        waiting = self._outbox.peek(_PUMP_BATCH, after=sent.upto)
        if not waiting:
            self._wake.wait(_PUMP_IDLE_S)  # a put wakes it
            self._wake.clear()
            return True
        # Bytes already going (answers ahead, rows sent ahead earlier) are not counted twice.
        skip = sent.early | {q.seq for q in ahead}
        room = self._window - _size(ahead)
        batch = _fit(waiting, room, skip, at_least_one=True)
        backlog = len(batch) < len(waiting) or len(waiting) == _PUMP_BATCH
        if not backlog and not stopping and all(q.priority != Priority.CRITICAL for q in batch):
            # Results and telemetry only, and all of them: let more gather, unless an
            # answer comes.
            self._urgent.wait(_GATHER_S)
            limit = _PUMP_BATCH - len(batch)
            more = self._outbox.peek(limit, after=batch[-1].seq)
            room -= _size(q for q in batch if q.seq not in skip)
            taken = _fit(more, room, skip, at_least_one=False)
            backlog = len(taken) < len(more) or len(more) == limit
            batch += taken
        sent.full = backlog
        if backlog:
            # More waits than this batch takes: the newest telemetry may be behind it.
            newest = self._outbox.newest(Priority.TELEMETRY, after=batch[-1].seq)
            if newest is not None and newest.seq > sent.telemetry_ahead:
                # Only one newer than the last to go ahead: once that is acknowledged, the
                # newest waiting is older, history that keeps its place.
                ahead.append(newest)
                sent.telemetry_ahead = newest.seq
        sent.since = time.monotonic()
        for queued in ahead:
            self._publish(queued)
            sent.early.add(queued.seq)
        for queued in batch:
            sent.upto = queued.seq
            if queued.seq not in sent.early:
                self._publish(queued)
        sent.early = {seq for seq in sent.early if seq > sent.upto}
        return True

    def _settle(self) -> bool:
        """Wait for what is in flight, sending answers that come meanwhile behind it."""
        sent = self._sent
        stopping = self._stop.is_set()
        if stopping:
            wait = _STOP_FLUSH_S
        elif self._session.connected.is_set():
            wait = _ANSWER_POLL_S
        else:
            wait = _OFFLINE_POLL_S  # paho sends the batch again once the link is back
        if self._session.flush(wait):
            took = max(time.monotonic() - sent.since, 1e-3)
            self._took.append(took)
            if sent.full:
                # The window for the next batch: the rate this one went at, over the round
                # trip and _WINDOW_S. Only a batch the window limited measures the link: a
                # short one, all that waited, would say the link is as slow as the box is
                # quiet.
                rate = sent.bytes / took
                self._window = max(_WINDOW_MIN_BYTES, int(rate * (min(self._took) + _WINDOW_S)))
            self._outbox.ack(sent.in_flight)
            sent.in_flight = []
            sent.bytes = 0
            return True
        if stopping:
            return False  # they stay in the outbox for the next start
        if self._urgent.is_set():
            # Now, not after the batch: it queues behind at most a window's bytes.
            self._urgent.clear()
            for queued in self._answers():
                self._publish(queued)
                sent.early.add(queued.seq)
        return True

    def _answers(self) -> list[Queued]:
        """Answers past the pump's place that have not gone yet."""
        sent = self._sent
        return [
            queued
            for queued in self._outbox.peek_answers(_PUMP_BATCH, after=sent.upto)
            if queued.seq not in sent.early  # sent, and its ack refused by the disk
        ]

    def _publish(self, queued: Queued) -> None:
        self._outbox.going(queued)  # first: a put meanwhile must not drop it for room
        self._session.publish(queued.topic, queued.payload, qos=queued.qos, retain=queued.retain)
        self._sent.in_flight.append(queued.seq)
        self._sent.bytes += _size([queued])


def _fit(waiting: list[Queued], room: int, skip: set[int], *, at_least_one: bool) -> list[Queued]:
    """The first of `waiting` whose bytes fit in `room`, those of `skip` counting nothing."""
    taken: list[Queued] = []
    for queued in waiting:
        if queued.seq not in skip:
            room -= _size([queued])
        if room < 0 and (taken or not at_least_one):
            break
        taken.append(queued)
    return taken


def _size(messages: Iterable[Queued]) -> int:
    """Bytes as the outbox counts them: topic and payload."""
    return sum(len(q.topic) + len(q.payload) for q in messages)


@dataclass(slots=True)
class _Sent:
    """The pump's place: the last sequence published, and those the broker has yet to ack."""

    upto: int = 0
    in_flight: list[int] = field(default_factory=list)
    early: set[int] = field(default_factory=set)
    """Answers and telemetry sent ahead of `upto`: not sent again, however long their rows
    stay (an ack the disk refused leaves them)."""
    telemetry_ahead: int = 0
    """The newest telemetry sent ahead."""
    bytes: int = 0
    """What `in_flight` holds."""
    full: bool = False
    """The batch in flight was cut short by the window (or the message cap): more waited."""
    since: float = 0.0
    """When the batch in flight went (monotonic)."""
    next_move: float = 0.0
    """When an outbox held in memory next tries its file (monotonic)."""
