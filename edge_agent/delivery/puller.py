"""The device side of one release's delivery over MQTT, as a state machine.

It is fed messages (from any thread, or a single-threaded event loop) and
`tick(now)` calls, and publishes through a `Communicator`; it never blocks, so
200 of them share one `selectors` loop in the benchmark and one thread each in
the agent.

    join ──frames──▶ broadcast ──status "done" / idle──▶ repair ──all chunks──▶ complete
      ▲                  │ idle (broker outage, broadcaster gone)
      └──── rejoin ◀─────┘

- broadcast: chunks arrive on the release's chunk topic; each frame is acked
  (its sequence number) so the broadcaster paces to its slowest active puller.
  Joins, acks, leaves and repair requests go on this device's own topics
  (`Topics.own_control`, `own_repair`), which a broker ACL lets its box alone write.
- repair: what is still missing is asked for in GetStream-shaped requests
  (offset, count, bitmap), one outstanding at a time, answered one chunk per
  message on this device's reply topic, with MQTT 5 request/response (the
  Response Topic and Correlation Data ride in the payload on 3.1.1). The
  correlation data is random: an error, or an MQTT 5 frame, that names none of
  this puller's latest requests is no answer to it (anyone who can have a
  message sent to its reply topic could otherwise abort the pull).
"""

from __future__ import annotations

import base64
import logging
import random
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from pydantic import ValidationError

from edge_agent.comms.base import Communicator, Message, Unsubscribe
from edge_agent.delivery.partial import PartialTransfer
from edge_agent.errors import EdgeAgentError
from edge_agent.protocol.delivery import (
    MAX_REPAIR_BLOCKS,
    MAX_REPAIR_BYTES,
    Ack,
    BroadcastStatus,
    Join,
    Leave,
    RepairError,
    RepairRequest,
    bitmap,
    decode_base64,
    decode_frame,
    encode_bits,
)
from edge_agent.protocol.topics import Topics

log = logging.getLogger(__name__)

CORRELATION_BYTES = 16
"""Random correlation data per request: no one else can guess what answers it."""
ASKED_KEPT = 4
"""Requests whose answers are still taken for answers (the latest and the ones it resent)."""

State = Literal["new", "broadcast", "repair", "complete", "stopped"]


@dataclass(frozen=True, slots=True)
class PullerOptions:
    """Timings of the device side; the defaults suit a LAN broker and a WAN uplink alike."""

    idle_s: float = 2.0
    """No frame for this long while in the broadcast: rejoin (or go to repair)."""
    rejoins: int = 2
    """Rejoins in a row with no new chunk before giving up on the broadcast and repairing
    the rest; a chunk stored from the broadcast restores them."""
    repair_blocks: int = 16
    """Chunks per repair request (at most MAX_REPAIR_BLOCKS, and MAX_REPAIR_BYTES of them):
    2 MiB at 128 KiB chunks."""
    repair_timeout_s: float = 3.0
    """A repair request with no answer for this long is sent again; each time unanswered
    doubles the wait (to `repair_max_s`), and every wait is drawn from 1x to 1.5x of it."""
    repair_max_s: float = 30.0
    """The longest wait for an answer before a repair request is sent again."""
    repair_spread_s: float = 1.0
    """The first repair request goes out after a wait drawn from [0, this]."""
    sync_every: int = 64
    """fdatasync the partial files every this many chunks (resume loses at most these)."""


@dataclass(slots=True)
class PullStats:
    """What one pull cost, for the progress line, the report and the benchmarks."""

    frames: int = 0
    stored: int = 0
    duplicates: int = 0
    bad: int = 0
    repaired: int = 0
    repair_requests: int = 0
    rejoins: int = 0
    resumed: int = 0
    ignored: int = 0
    """Errors and frames on the reply topic that answered none of this puller's requests."""
    bytes_in: int = 0
    joined_at: float = field(default=0.0)


class Puller:
    """Pull one release into a `PartialTransfer` over MQTT."""

    def __init__(
        self,
        comm: Communicator,
        topics: Topics,
        device_id: str,
        partial: PartialTransfer,
        *,
        options: PullerOptions | None = None,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.comm = comm
        self.topics = topics
        self.device_id = device_id
        self.partial = partial
        self.release = partial.chunks.release
        self.rid = partial.chunks.id
        self.options = options or PullerOptions()
        self.clock = clock
        self.state: State = "new"
        self.error: EdgeAgentError | None = None
        self.done = threading.Event()
        self.stats = PullStats(resumed=partial.resumed)
        self._lock = threading.RLock()
        self._subs: dict[str, Unsubscribe] = {}
        self._last_rx = clock()
        self.flowing_at = 0.0
        """When the last broadcast frame came, new to this puller or not, within a lap of
        the last one it stored (the pull's stall timer takes a flowing broadcast for
        progress)."""
        self._dry = 0
        """Broadcast frames in a row that brought nothing this puller lacks."""
        self._rejoins_left = self.options.rejoins
        self._wanted: set[int] = set()
        self._deadline = 0.0
        # Every box of a fleet is told the broadcast is over by one status message, and a
        # repair server that drops a burst of requests drops them for all alike: the first
        # request and every resend are spread, and resends back off, or the ones dropped
        # all come back together, again and again.
        self._rng = rng or random.Random()
        self._unanswered = 0
        # How far apart answers arrive: the downlink's pace. A resend waited a flat
        # repair_timeout_s after the last answer, shorter than one 128 KiB frame takes under
        # about 350 kbit/s: each slow frame sent the whole request again, the answers piled
        # up for the box (24 MiB queued for an 8 MiB release at 256 kbit/s after 10 minutes,
        # half of it done) and the backoff never began, as each late answer reset it.
        self._last_answer: float | None = None
        self._gap = 0.0
        self._asked_at = 0.0
        """When the request now waited on was first sent (its resends keep the time)."""
        self._asked: deque[bytes] = deque(maxlen=ASKED_KEPT)
        """Correlation data of the latest requests: answers to a request resent meanwhile
        may still come, and are answers all the same."""
        self._since_sync = 0
        name, version = self.release.name, self.release.version
        self._chunk_topic = topics.chunks(name, version)
        self._reply_topic = topics.delivery_reply(device_id)

    # --- driving -------------------------------------------------------------------------------
    def start(self) -> None:
        with self._lock:
            if self.partial.complete:
                self._complete()
                return
            name, version = self.release.name, self.release.version
            self._subs["reply"] = self.comm.subscribe(self._reply_topic, self.on_reply, qos=0)
            self._subs["status"] = self.comm.subscribe(
                self.topics.status(name, version), self.on_status, qos=1
            )
            self._subs["chunks"] = self.comm.subscribe(self._chunk_topic, self.on_frame, qos=0)
            self.stats.joined_at = self.clock()
            self._join()

    def tick(self, now: float | None = None) -> None:
        """Timers: rejoin or repair after silence, resend a repair that went unanswered."""
        now = self.clock() if now is None else now
        with self._lock:
            if self.state == "broadcast" and now - self._last_rx > self.options.idle_s:
                if self._rejoins_left > 0:
                    self._rejoins_left -= 1
                    self.stats.rejoins += 1
                    self._join()
                else:
                    self._to_repair()
            elif self.state == "repair" and now > self._deadline:
                if self.stats.repair_requests:  # a resend, not the first request
                    self._unanswered += 1
                self._request()

    def stop(self) -> None:
        """Stop pulling (cancel, or the caller gave up); the partial stays for a resume."""
        with self._lock:
            if self.state == "broadcast":
                self._control(Leave(device_id=self.device_id, reason="cancelled"))
            if self.state not in ("complete",):
                self.state = "stopped"
            self._unsubscribe()
            self.done.set()

    # --- handlers --------------------------------------------------------------------------------
    def on_frame(self, message: Message) -> None:
        frame = decode_frame(message.payload)
        if frame is None or frame.release_id != self.rid:
            return
        with self._lock:
            if self.state in ("complete", "stopped"):
                return
            stored = self._store(frame.index, frame.data)
            if self.state != "broadcast":
                return
            # Only the broadcast says the broadcast is alive: a frame on its topic, which
            # no box may write, even of a chunk this puller has (others need it). Frames
            # on the reply topic did too, so answers to requests forged in this device's
            # name (one a second) kept a puller whose broadcaster was gone waiting for it,
            # asking nothing, until the pull failed at stall_s.
            self._dry = 0 if stored else self._dry + 1
            if self._dry > self.partial.count:
                # A whole lap and none of what it asked for: the broadcaster does not count
                # it (dropped from the window behind a flaky link, its join refused), and
                # would carry others' chunks past it for as long as the fleet joins. Taken
                # as silence: it rejoins, then repairs, and the pull's stall timer runs.
                return
            self._last_rx = self.flowing_at = self.clock()
            if stored:
                # The broadcast flows again: a later outage gets its rejoins too. Kept
                # spent, a long pull's third gap (a broker restart, a cellular handover)
                # sent the rest as unicast repair, per box: at fleet scale, the broker's
                # whole load.
                self._rejoins_left = self.options.rejoins
            if frame.seq:
                ack = Ack(device_id=self.device_id, seq=frame.seq)
                self._control(ack, qos=0)

    def on_status(self, message: Message) -> None:
        try:
            status = BroadcastStatus.model_validate_json(message.payload)
        except ValidationError:
            return
        with self._lock:
            if status.release_id == self.rid and self.state == "broadcast":
                if self.device_id in status.done:
                    self._to_repair()
                elif status.state != "idle":
                    self._last_rx = self.clock()  # the broadcaster is alive and busy

    def on_reply(self, message: Message) -> None:
        frame = decode_frame(message.payload)
        with self._lock:
            if self.state in ("complete", "stopped"):
                return
            if frame is not None:
                if frame.release_id == self.rid:
                    # Kept wherever it came from: a chunk is checked against its hash.
                    self.stats.repaired += self._store(frame.index, frame.data)
                    if not self._answers(message, frame.index):
                        self.stats.ignored += 1  # but it answers no request of ours
                        return
                    self._wanted.discard(frame.index)
                    self._unanswered = 0
                    now = self.clock()
                    # From the answer before, or from the request for the first answer:
                    # quick to grow, slow to shrink, so a slow link is waited for at once.
                    last = self._last_answer
                    since = now - (
                        last if last is not None and last > self._asked_at else self._asked_at
                    )
                    self._gap = max(since, 0.8 * self._gap)
                    self._last_answer = now
                    self._deadline = now + self._answer_wait()
                    if self.state == "repair" and not self._wanted:
                        self._request()
                return
            try:
                error = RepairError.model_validate_json(message.payload)
            except ValidationError:
                return
            if error.release_id != self.rid:
                return
            text = error.correlation_data  # on 3.1.1, where no property comes
            carried = decode_base64(text) if text else None
            if not self._ours(message.correlation_data or carried):
                self.stats.ignored += 1
                return
            self.error = EdgeAgentError(
                f"the fleet cannot serve {self.release.name} v{self.release.version}: "
                f"{error.message}",
                "check `edge-fleet serve` has the release in its repository",
                code="transfer.failed",
            )
            self.stop()

    # --- steps ------------------------------------------------------------------------------------
    def _store(self, index: int, data: bytes) -> int:
        """Keep chunk `index` if it is new and its hash matches; 1 if it was kept, else 0."""
        self.stats.frames += 1
        self.stats.bytes_in += len(data)
        if self.partial.has(index):
            self.stats.duplicates += 1
            return 0
        try:
            if not self.partial.write(index, data):
                self.stats.bad += 1
                return 0
            self.stats.stored += 1
            self._since_sync += 1
            if self._since_sync >= self.options.sync_every or self.partial.complete:
                self.partial.sync()
                self._since_sync = 0
        except OSError as exc:
            # A full or failing disk: every later chunk would fail the same way.
            self.error = EdgeAgentError(
                f"cannot store {self.release.name} v{self.release.version}: {exc.strerror or exc}",
                "free space on the state disk, then deploy again (the transfer resumes)",
                code="transfer.failed",
            )
            self.error.__cause__ = exc  # pull removes the partial when the disk is full
            self.stop()
            return 0
        if self.partial.complete:
            self._complete()
        return 1

    def _join(self) -> None:
        self.state = "broadcast"
        self._dry = 0  # a lap from this join
        self._last_rx = self.clock()
        join = Join(
            device_id=self.device_id,
            release_id=self.rid,
            chunks=self.partial.count,
            missing=encode_bits(self.partial.missing_bitmap()),
        )
        self._control(join)

    def _to_repair(self) -> None:
        self.state = "repair"
        unsubscribe = self._subs.pop("chunks", None)
        if unsubscribe is not None:
            unsubscribe()  # broadcast frames others still need are not ours to pay for
        self._control(Leave(device_id=self.device_id, reason="repairing"))
        if not self.partial.missing():
            self._complete()
            return
        # `tick` sends the first request once this passes.
        self._deadline = self.clock() + self._rng.uniform(0.0, self.options.repair_spread_s)

    def _request(self) -> None:
        missing = self.partial.missing()
        if not missing:
            self._complete()
            return
        offset = missing[0]
        fit = max(1, MAX_REPAIR_BYTES // self.release.chunk_size)
        limit = min(self.options.repair_blocks, MAX_REPAIR_BLOCKS, fit)
        wanted = [i for i in missing if i < offset + MAX_REPAIR_BLOCKS][:limit]
        count = wanted[-1] - offset + 1
        correlation = secrets.token_bytes(CORRELATION_BYTES)
        self._asked.append(correlation)
        v5 = self.comm.mqtt_version == "5"
        request = RepairRequest(
            device_id=self.device_id,
            name=self.release.name,
            version=self.release.version,
            release_id=self.rid,
            block_size=self.release.chunk_size,
            offset=offset,
            count=count,
            bitmap=encode_bits(bitmap(count, [i - offset for i in wanted])),
            response_topic=None if v5 else self._reply_topic,
            correlation_data=None if v5 else base64.b64encode(correlation).decode(),
        )
        self._wanted = set(wanted)
        if not self._unanswered:
            self._asked_at = self.clock()
        backoff = 2 ** min(self._unanswered, 16)
        wait = min(self.options.repair_max_s, self.options.repair_timeout_s * backoff)
        wait = max(wait, self._answer_wait())
        self._deadline = self.clock() + wait * self._rng.uniform(1.0, 1.5)
        self.stats.repair_requests += 1
        self.comm.publish(
            self.topics.own_repair(self.device_id),
            request.model_dump_json(exclude_none=True).encode(),
            qos=1,
            response_topic=self._reply_topic,
            correlation_data=correlation,
        )

    def _answer_wait(self) -> float:
        """How long the next answer may take before the request is sent again: three of the
        link's gaps between answers, never less than repair_timeout_s, and never more than
        four repair_max_s (a gap that was an outage must not hold back every resend)."""
        wait = min(3.0 * self._gap, 4.0 * self.options.repair_max_s)
        return max(self.options.repair_timeout_s, wait)

    def _complete(self) -> None:
        was_broadcast = self.state == "broadcast"
        self.state = "complete"
        if was_broadcast:
            self._control(Leave(device_id=self.device_id, reason="complete"))
        self._unsubscribe()
        self.done.set()

    def _control(self, message: Join | Ack | Leave, qos: int = 1) -> None:
        topic = self.topics.own_control(self.device_id, self.release.name, self.release.version)
        self.comm.publish(topic, message.model_dump_json().encode(), qos=qos)

    def _ours(self, correlation: bytes | None) -> bool:
        return correlation is not None and correlation in self._asked

    def _answers(self, message: Message, index: int) -> bool:
        """Whether a repair frame of chunk `index` answers a request of this puller: only
        an answer moves the resend on. Any box may have the fleet answer requests it sends
        in this device's name, once a second, say; taken for answers, those put off the
        resend of a request that was lost for as long as they came."""
        if message.correlation_data is not None:
            return self._ours(message.correlation_data)
        if self.comm.mqtt_version == "5":
            # Every request of ours carries correlation data, and a server echoes it on
            # each frame: one with none answers a request someone else sent without.
            return False
        # MQTT 3.1.1 carries no correlation with a frame: a chunk the latest request asked
        # for answers it, whoever asked.
        return index in self._wanted

    def _unsubscribe(self) -> None:
        for unsubscribe in self._subs.values():
            unsubscribe()
        self._subs.clear()
