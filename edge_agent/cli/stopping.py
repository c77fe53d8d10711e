"""SIGINT and SIGTERM as a request to stop, never as an exception in flight.

Python's default SIGINT raises KeyboardInterrupt wherever the main thread is.
Raised into `Thread.join` it can leave the join returning early (CPython
gh-90882), so the interpreter exits while engine threads still run, and the
C++ runtime aborts the process ("terminate called without an active
exception", exit 134). Here a signal only records itself; the main thread,
which does nothing but wait, sees it within one tick and calls the pipeline's
own `stop()`: the same stop path the agent uses.

Before the work starts (compiling, opening the source) there is nothing to
stop yet, so `exit_on_signals` turns a signal into an ordinary exit.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import TypeVar

T = TypeVar("T")

SIGNALS = (signal.SIGINT, signal.SIGTERM)
TICK_S = 0.1
"""How often the waiting main thread looks at the signal flag (and refreshes a display)."""
GRACE_S = 5.0
"""After a stop request, how long run() may take before the process leaves without it.
The stop path promises 2 s; this is the safety net for a bug there, not the normal way."""

Handler = Callable[[int, FrameType | None], object] | int | None


def exit_code(signum: int) -> int:
    """The shell's convention: 128 + the signal number (130 for SIGINT, 143 for SIGTERM)."""
    return 128 + signum


def _say(text: str) -> None:
    # os.write, not print: a handler may run while the main thread is inside a write to
    # the same stream, and a buffered stream refuses reentrant writes.
    os.write(sys.stderr.fileno(), f"edge-agent: {text}\n".encode())


@contextmanager
def exit_on_signals(engines: Iterable[str] = ()) -> Iterator[None]:
    """While this block runs, SIGINT or SIGTERM ends it with SystemExit(128 + signal).

    For the preparation before a pipeline runs: `finally` blocks still release what
    was built, and no engine thread is running work yet.

    Args:
        engines: the backends the block will use (`runtime.BACKENDS` names), imported first.

    Raises:
        EdgeAgentError: an engine does not import (`runtime.load_engine`).
    """
    from edge_agent.runtime import load_engine

    # The engines are imported first, outside the handler: a SystemExit raised inside a C
    # extension's import (pybind11's) comes out as "ImportError: initialization failed",
    # not as the exit it was (main.run_command maps any other such import back to it).
    # Only those asked for: importing OpenVINO for an ONNX Runtime pipeline failed it on a
    # box whose OpenVINO does not load.
    for name in engines:
        load_engine(name)

    def handler(signum: int, frame: FrameType | None) -> None:
        _say(f"stopped by {signal.Signals(signum).name} before the pipeline started")
        raise SystemExit(exit_code(signum))

    previous = {s: signal.signal(s, handler) for s in SIGNALS}
    try:
        yield
    finally:
        for s, old in previous.items():
            signal.signal(s, old)


def run_until_stopped(
    work: Callable[[], T],
    stop: Callable[[], None],
    tick: Callable[[], None] | None = None,
    grace_s: float = GRACE_S,
) -> tuple[T, int | None]:
    """Run `work` on a worker thread; on SIGINT/SIGTERM call `stop` and wait for it.

    Args:
        work: the blocking run, e.g. `PipelineHandle.run`.
        stop: asks `work` to return soon; called once, from the main thread.
        tick: called every TICK_S on the main thread while waiting (a live display).
        grace_s: seconds after the stop request before giving up on `work` and exiting
            the process at once (os._exit, so no engine thread is torn down under way).

    Returns:
        `work`'s result and the signal number that stopped it, or None.

    Raises:
        Whatever `work` raised, re-raised on the main thread.
    """
    result: list[T] = []
    failure: list[BaseException] = []
    received: list[int] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        if received:
            _say(f"second {signal.Signals(signum).name}: leaving without a clean stop")
            os._exit(exit_code(received[0]))
        received.append(signum)  # appending is atomic; no lock a handler could deadlock on

    def target() -> None:
        try:
            result.append(work())
        except BaseException as exc:  # handed to the main thread, which reports it
            failure.append(exc)

    worker = threading.Thread(target=target, name="pipeline-run", daemon=True)
    previous: dict[int, Handler] = {s: signal.signal(s, handler) for s in SIGNALS}
    try:
        worker.start()
        stop_asked: float | None = None
        while worker.is_alive():
            worker.join(TICK_S)
            if received and stop_asked is None:
                stop_asked = time.monotonic()
                stop()
            if tick is not None:
                tick()
            if stop_asked is not None and time.monotonic() - stop_asked > grace_s:
                _say(f"the pipeline did not stop within {grace_s:.0f} s; leaving without it")
                sys.stdout.flush()
                os._exit(exit_code(received[0]))
    finally:
        for s, old in previous.items():
            signal.signal(s, old)
    if failure:
        raise failure[0]
    return result[0], (received[0] if received else None)
