"""The pipelines' stop path: a stop request any thread or signal handler can make, and
waits that always notice it.

`stop()` must end `run()` within `STOP_BUDGET_S` whatever a source, head or sink
does: a source stuck in `read()`, a sink that sleeps, an engine that never calls
back. So no pipeline thread ever blocks without a timeout: each wait polls the
stop flag every `POLL_S`, and `run()` waits for its workers only `GRACE_S` past
the stop request before it leaves them behind (they are daemon threads and exit
at their next check) and counts what they still held as dropped.

A wait that only a stop request (or a stuck engine) would end looks at the flag every
`IDLE_POLL_S` instead: each wake of a pipeline thread takes a core from an engine thread
in the middle of an inference, and a box running many streams runs many such waits.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from edge_agent.errors import EdgeAgentError

POLL_S = 0.05
"""How often a blocked wait looks at the stop flag."""

IDLE_POLL_S = 0.5
"""How often a wait that frames, not the stop, normally end (the emitter's, `supervise`'s)
looks at its flags. It stays under `GRACE_S`, so a stop is seen before its grace is up.
At 20 Hz these wakes were 3 of a frame's 10 context switches with 16 realtime streams at
15 FPS on 2 cores (each pipeline's caller and emitter woke 20 times a second for frames
that come 15 times a second)."""

STOP_BUDGET_S = 2.0
"""The promise: `run()` returns within this long of `stop()`."""

GRACE_S = 1.5
"""Of that budget, how long frames in flight get to finish; the rest is for wrapping up."""

ENGINE_STALL_S = 60.0
"""Frames in flight and none back for this long: the engine is stuck, and the pipeline
ends with an error instead of waiting for ever. Far above any first inference (a GPU's
included), far below what an operator would wait before calling the box hung. Each
pipeline module reads it as its own global, so a test can shorten it for one of them."""


def stuck_engine(idle_s: float, held: str) -> EdgeAgentError:
    """The error a pipeline ends with when its engine kept `held` for `idle_s` seconds."""
    return EdgeAgentError(
        f"inference has not returned for {idle_s:.0f} s ({held}): the engine is stuck",
        "`kill -USR1` the process for its thread stacks, then restart it; a device "
        "that keeps doing this needs its driver checked (edge-agent doctor)",
        code="inference.failed",
    )


class StopFlag:
    """A stop request that is safe to make from a signal handler.

    `threading.Event.set` takes a lock that the interrupted main thread may be
    holding inside `Event.wait`, which deadlocks; `set` here only stores a time,
    and waiters poll.
    """

    __slots__ = ("_at",)

    def __init__(self) -> None:
        self._at: float | None = None

    def set(self) -> None:
        """Request the stop; later calls keep the first request's time."""
        if self._at is None:
            self._at = time.monotonic()

    def is_set(self) -> bool:
        """True once `set` has been called."""
        return self._at is not None

    @property
    def at(self) -> float | None:
        """`time.monotonic()` of the first `set`, or None."""
        return self._at

    def past_grace(self, grace_s: float = GRACE_S) -> bool:
        """True once `grace_s` has passed since the stop was requested."""
        at = self._at
        return at is not None and time.monotonic() - at >= grace_s


def acquire_unless(lock: threading.Semaphore, halted: Callable[[], bool]) -> bool:
    """Acquire `lock`, giving up when `halted()` turns true; True when acquired."""
    while not lock.acquire(timeout=POLL_S):
        if halted():
            return False
    return True


def supervise(worker: threading.Thread, stop: StopFlag, grace_s: float = GRACE_S) -> bool:
    """Wait for `worker` to end, but no longer than `grace_s` after `stop` is set.

    Returns:
        True when the worker ended; False when it was left behind.
    """
    while True:
        # Until the stop, wake seldom (joining returns the moment the worker ends); after
        # it, wait exactly to the end of its grace.
        at = stop.at
        # (Never under POLL_S before it: a grace of 0 must not spin.)
        idle = min(IDLE_POLL_S, max(grace_s, POLL_S))
        left = idle if at is None else at + grace_s - time.monotonic()
        worker.join(max(0.0, left))
        if not worker.is_alive():
            return True
        if stop.past_grace(grace_s):
            return False
