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
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

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


@dataclass(slots=True)
class _Puller:
    needed: set[int]
    acked: int
    last: float


@dataclass(slots=True)
class BroadcastStats:
    frames: int = 0
    bytes: int = 0
    joins: int = 0
    stalls: int = 0
    passes_done: int = 0


class Broadcast:
    """One release's broadcast. Not thread-safe: the server calls it under its lock."""

    def __init__(
        self,
        chunks: ChunkMap,
        read_chunk: Callable[[int], bytes],
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
        self._demand = [0] * len(chunks)
        self._pos = 0
        self._seq = 1
        self._sent_at: dict[int, float] = {}
        self._gather_until: float | None = None
        self._done: dict[str, float] = {}
        """Pullers sent everything they asked for, and when: named in a status once
        `done_grace_s` passes without their leave."""
        self._state: BroadcastState = "idle"

    @property
    def active(self) -> bool:
        return bool(self._pullers)

    # --- control -----------------------------------------------------------------------------
    def join(self, msg: Join, now: float) -> None:
        if msg.release_id != self.chunks.id or msg.chunks != len(self.chunks):
            return
        bits = decode_bits(msg.missing, len(self.chunks))
        if bits is None:
            return
        self._drop(msg.device_id)
        self._done.pop(msg.device_id, None)
        needed = {i for i in range(len(self.chunks)) if bit(bits, i)}
        if not needed:
            self._done[msg.device_id] = now - self.options.done_grace_s  # said at once
            return
        for i in needed:
            self._demand[i] += 1
        self._pullers[msg.device_id] = _Puller(needed, self._seq - 1, now)
        self.stats.joins += 1
        if self._state == "idle":
            self._gather_until = now + self.options.gather_s
            self._set_state("gathering", now)

    def ack(self, msg: Ack, now: float) -> None:
        puller = self._pullers.get(msg.device_id)
        if puller is not None and msg.seq > puller.acked:
            puller.acked = min(msg.seq, self._seq - 1)
            puller.last = now

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
                self._send_next(now)
                continue
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
        if self._done:  # some not said yet: back when the first is due
            due = max(0.0, min(self._done.values()) + self.options.done_grace_s - now)
            wait = due if wait is None else min(wait, due)
        return wait

    def _send_next(self, now: float) -> None:
        n = len(self.chunks)
        index = self._pos
        for _ in range(n):
            if self._demand[index] > 0:
                break
            index = (index + 1) % n
        frame = Frame(self.chunks.id, index, self.read_chunk(index), seq=self._seq)
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
            if index in puller.needed:
                puller.needed.discard(index)
                self._demand[index] -= 1
                if not puller.needed:
                    del self._pullers[device]
                    self._done[device] = now
                    self.stats.passes_done += 1

    def _drop(self, device: str) -> None:
        puller = self._pullers.pop(device, None)
        if puller is not None:
            for i in puller.needed:
                self._demand[i] -= 1

    def _set_state(self, state: BroadcastState, now: float) -> None:
        """Say `state`, if it changed, and the pullers now due in `done`."""
        changed = state != self._state
        self._state = state
        done = [d for d, at in self._done.items() if now - at >= self.options.done_grace_s]
        if changed or done:
            for device in done:
                del self._done[device]
            status = BroadcastStatus(
                release_id=self.chunks.id,
                broadcaster=self.instance,
                state=state,
                seq=self._seq,
                done=done,
            )
            self.send_status(status)
