"""The fleet side's paced broadcast of one release to the devices pulling it.

Why paced, and paced how: issue 9 measured 1,000 devices on one mosquitto. An
unpaced broadcast of 10 MB drove the broker to 4 GB (it copies each message
into every subscriber's send queue faster than sockets drain); a paced one
reached all of them in 7.6-9.2 s with 10 MB of broker memory. Here the pace
is a window, as in TCP: frame `seq` goes out only when every active puller has
acked `seq - window` or later, so the broker never holds more than `window`
frames per subscriber and the rate follows the pullers, not a guess.

- Devices join with a bitmap of what they miss; the broadcast is a carousel
  that sends each chunk some active puller still needs, in index order,
  wrapping around for late joiners, so a chunk goes once per pass for everyone.
- A puller that stops acking for `stall_s` is dropped from the window (it will
  rejoin or repair), so one slow or dead box never freezes the fleet.
- When a puller has been sent everything it asked for, `done` in the status
  message tells it to repair what it lost, unless it left, complete, within
  `done_grace_s`: every puller gets every status, so naming all 5,000 boxes of a
  fleet that finished on one frame sent 5,000 x 100 KB through the broker at once.
- A short `gather_s` after the first join lets a fleet that is told to deploy
  at once join before the first frame, so the carousel rarely wraps.
- A join's `device_id` is whatever its sender wrote (docs/PROTOCOL.md): at most
  `max_pullers` are tracked (each costs a bitmap of the release and a name in a
  status), and statuses are paced and carry at most `max_done_names` names, so a
  flood of forged joins makes a few statuses, never one each. The server limits
  how often one device id may join (delivery/joins.py).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from edge_agent.delivery.buckets import TokenBuckets
from edge_agent.delivery.chunks import ChunkMap
from edge_agent.protocol.delivery import (
    Ack,
    BroadcastState,
    BroadcastStatus,
    Frame,
    Join,
    Leave,
    bit,
    decode_bits,
    set_bit,
)


@dataclass(frozen=True, slots=True)
class BroadcastOptions:
    """Pacing of the broadcast."""

    window: int = 4
    """Frames a puller may be behind; broker memory is about window x chunk x pullers."""
    gather_s: float = 0.05
    """Wait after the first join of an idle broadcast, for others to join."""
    stall_s: float = 1.5
    """A puller silent this long while behind the window leaves it."""
    done_grace_s: float = 1.0
    """How long a puller sent everything it asked for has to say it is complete (its
    leave) before a status names it in `done`, to repair what it lost."""
    max_pullers: int = 10_000
    """Pullers tracked at most (in the window, or waiting to be named in `done`); a join
    past it is ignored, and its puller takes the frames others asked for, then repairs.
    Twice a 5,000-box fleet: what it bounds is memory (a bitmap of the release each) and
    the names a status may have to carry to every puller."""
    max_done_names: int = 500
    """Names in one status at most (about 10 KB); the rest go in the next."""
    status_burst: int = 8
    """Statuses sent at once at most: a broadcast's whole life (gathering, sending, idle,
    done) is four."""
    statuses_per_s: float = 4.0
    """Statuses a second after the burst: more news waits and goes in one."""


@dataclass(slots=True)
class _Puller:
    needed: bytearray
    """Bitmap of the chunks it still needs from this pass (as in its join)."""
    left: int
    """Bits set in `needed`."""
    acked: int
    last: float


@dataclass(slots=True)
class BroadcastStats:
    frames: int = 0
    bytes: int = 0
    joins: int = 0
    stalls: int = 0
    passes_done: int = 0
    refused: int = 0
    """Joins of new pullers past `max_pullers`."""
    unreadable: int = 0
    """Chunks the repository could not give (`read_chunk` said None), each time."""


UNREADABLE_RETRY_S = 1.0
"""How soon a chunk the repository could not give is tried again: a re-publish replacing
its files is over by then, and a damaged file is not read in a busy loop."""


class Broadcast:
    """One release's broadcast. Not thread-safe: the server calls it under its lock."""

    def __init__(
        self,
        chunks: ChunkMap,
        read_chunk: Callable[[int], bytes | None],
        send_frame: Callable[[bytes], None],
        send_status: Callable[[BroadcastStatus], None],
        instance: str,
        options: BroadcastOptions | None = None,
    ) -> None:
        self.chunks = chunks
        self.read_chunk = read_chunk
        self.send_frame = send_frame
        self.send_status = send_status
        self.instance = instance
        self.options = options or BroadcastOptions()
        self.stats = BroadcastStats()
        self._pullers: dict[str, _Puller] = {}
        # How many pullers in the window need each chunk. An array, as a join or a drop adds
        # or takes a whole bitmap: a loop over a 1 GB model's 8,192 chunks took 0.9 ms of
        # the server's lock per join, 4.5 s for a fleet of 5,000 rejoining after an outage.
        self._demand = np.zeros(len(chunks), dtype=np.int32)
        self._pos = 0
        self._seq = 1
        self._sent_at: dict[int, float] = {}
        self._gather_until: float | None = None
        self._done: dict[str, float] = {}
        """Pullers sent everything they asked for, and when they are due to be named in a
        status (`done_grace_s` later), unless they leave first."""
        self._due: list[tuple[float, str]] = []
        """`_done` as a heap by due time; an entry no longer in `_done` is skipped."""
        self._state: BroadcastState = "idle"
        self._state_said = True
        self._statuses = TokenBuckets(self.options.status_burst, self.options.statuses_per_s, 1)

    @property
    def active(self) -> bool:
        return bool(self._pullers)

    @property
    def pullers(self) -> frozenset[str]:
        """The devices in the window now."""
        return frozenset(self._pullers)

    @property
    def tracked(self) -> int:
        """Pullers in the window or waiting to be named in `done` (at most `max_pullers`)."""
        return len(self._pullers) + len(self._done)

    # --- control -----------------------------------------------------------------------------
    def join(self, msg: Join, now: float) -> None:
        n = len(self.chunks)
        if msg.release_id != self.chunks.id or msg.chunks != n:
            return
        bits = decode_bits(msg.missing, n)
        if bits is None:
            return
        device = msg.device_id
        known = device in self._pullers or device in self._done
        if not known and self.tracked >= self.options.max_pullers:
            self.stats.refused += 1
            return
        self._drop(device)
        self._done.pop(device, None)
        needed = bytearray(bits[: (n + 7) // 8])
        for i in range(n, len(needed) * 8):  # bits past the last chunk mean nothing
            set_bit(needed, i, False)
        left = int.from_bytes(needed, "little").bit_count()
        if not left:
            self._name_done(device, now - self.options.done_grace_s)  # said at once
            return
        self._demand += _bits(needed, n)
        self._pullers[device] = _Puller(needed, left, self._seq - 1, now)
        self.stats.joins += 1
        if self._state == "idle":
            self._gather_until = now + self.options.gather_s
            self._set_state("gathering", now)

    def ack(self, msg: Ack, now: float) -> bool:
        """Note how far `msg`'s puller has got.

        Returns:
            True only when the ack moved a puller in the window forward: what shows that a
            device receives. A stale ack (a seq it acked already, or any seq from a device
            not in the window) changes nothing and says nothing about its sender.
        """
        puller = self._pullers.get(msg.device_id)
        if puller is None:
            return False
        acked = min(msg.seq, self._seq - 1)
        if acked <= puller.acked:
            return False
        puller.acked = acked
        puller.last = now
        return True

    def leave(self, msg: Leave) -> None:
        self._drop(msg.device_id)
        # Complete, repairing or cancelled: it needs no `done`.
        self._done.pop(msg.device_id, None)

    # --- sending -------------------------------------------------------------------------------
    def step(self, now: float) -> float | None:
        """Send what the window allows.

        Returns:
            Seconds until a timer needs this broadcast again (gathering, or a stall
            check), or None when only an ack or a join can move it.
        """
        if self._gather_until is not None:
            if now < self._gather_until:
                return self._gather_until - now
            self._gather_until = None
            self._set_state("sending", now)
        wait: float | None = None
        while self._pullers:
            slowest = min(p.acked for p in self._pullers.values())
            if self._seq - slowest <= self.options.window:
                if self._send_next(now):
                    continue
                wait = UNREADABLE_RETRY_S  # nothing sent: the window holds, nothing stalls
                break
            # Window full: drop pullers that stalled behind it, else wait for acks.
            # Silent counts from the later of its last ack and the send of the first frame
            # it has not acked: a puller is not late for frames sent a moment ago.
            since = {
                d: max(p.last, self._sent_at.get(p.acked + 1, now))
                for d, p in self._pullers.items()
                if p.acked == slowest
            }
            stalled = [d for d, t in since.items() if now - t > self.options.stall_s]
            if not stalled:
                wait = max(0.0, min(since.values()) + self.options.stall_s - now) + 0.001
                break
            for device in stalled:
                self.stats.stalls += 1
                self._drop(device)
        self._set_state(self._state if self._pullers else "idle", now)
        news = self._news_in(now)
        if news is not None:  # back when the next status is due and may go
            wait = news if wait is None else min(wait, news)
        return wait

    def _send_next(self, now: float) -> bool:
        """Send the next chunk some puller needs; False if the repository could not give it
        (the next call goes on to the chunk after it, and comes back to it a lap later)."""
        n = len(self.chunks)
        index = self._pos
        if self._demand[index] <= 0:
            wanted = self._demand > 0
            ahead = np.flatnonzero(wanted[index:])
            behind = np.flatnonzero(wanted[:index])
            if ahead.size:
                index += int(ahead[0])
            elif behind.size:
                index = int(behind[0])
        data = self.read_chunk(index)
        if data is None:
            self.stats.unreadable += 1
            self._pos = (index + 1) % n
            return False
        frame = Frame(self.chunks.id, index, data, seq=self._seq)
        self.send_frame(frame.encode())
        self._sent_at[self._seq] = now
        # Keep send times only for frames some puller may still owe an ack for.
        floor = min((p.acked for p in self._pullers.values()), default=self._seq)
        for old in [s for s in self._sent_at if s <= floor]:
            del self._sent_at[old]
        self.stats.frames += 1
        self.stats.bytes += len(frame.data)
        self._seq += 1
        self._pos = (index + 1) % n
        for device, puller in list(self._pullers.items()):
            if bit(puller.needed, index):
                set_bit(puller.needed, index, False)
                puller.left -= 1
                self._demand[index] -= 1
                if not puller.left:
                    del self._pullers[device]
                    self._name_done(device, now)
                    self.stats.passes_done += 1
        return True

    def _drop(self, device: str) -> None:
        puller = self._pullers.pop(device, None)
        if puller is not None and puller.left:
            self._demand -= _bits(puller.needed, len(self.chunks))

    def _name_done(self, device: str, since: float) -> None:
        """Name `device` in `done` once `done_grace_s` has passed `since`, unless it leaves."""
        due = since + self.options.done_grace_s
        self._done[device] = due
        heapq.heappush(self._due, (due, device))

    def _set_state(self, state: BroadcastState, now: float) -> None:
        """Say `state`, if it changed, and the pullers now due in `done`, as the pace allows."""
        if state != self._state:
            self._state = state
            self._state_said = False
        if self._news_in(now) != 0.0 or not self._statuses.take("", now):
            return
        done: list[str] = []
        while self._due and self._due[0][0] <= now and len(done) < self.options.max_done_names:
            due, device = heapq.heappop(self._due)
            if self._done.get(device) == due:  # else it left, or joined again since
                del self._done[device]
                done.append(device)
        status = BroadcastStatus(
            release_id=self.chunks.id,
            broadcaster=self.instance,
            state=state,
            seq=self._seq,
            done=done,
        )
        self._state_said = True
        self.send_status(status)

    def _news_in(self, now: float) -> float | None:
        """Seconds until a status has news (a state not said, a puller due in `done`) and
        the pace lets it go; 0.0 for now, None when no news is coming."""
        while self._due and self._done.get(self._due[0][1]) != self._due[0][0]:
            heapq.heappop(self._due)  # left, or joined again: not news
        if self._state_said and not self._due:
            return None
        news = 0.0 if not self._state_said else max(0.0, self._due[0][0] - now)
        return max(news, self._statuses.wait("", now))


def _bits(bitmap: bytearray, n: int) -> npt.NDArray[np.uint8]:
    """Bit i of `bitmap` (as `bit` reads it) at index i, for the first `n`."""
    return np.unpackbits(np.frombuffer(bytes(bitmap), dtype=np.uint8), bitorder="little")[:n]
