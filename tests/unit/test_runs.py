"""`Runs`: queued callers blocked on the queue limit are served first come, first served.

Real threads on a real `Runs`; each round releases one slot at a time, so the order
the waiters get in is exactly the order they are served in.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping

import pytest

from edge_agent.errors import EdgeAgentError
from edge_agent.runtime import runs as runs_module
from edge_agent.runtime.base import Tensor, Tensors
from edge_agent.runtime.runs import Runs, ThreadedModel

WAIT_S = 5.0


def _until(condition: threading.Condition, check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    with condition:
        while not check():
            left = deadline - time.monotonic()
            assert left > 0, "timed out"
            condition.wait(left)


def _served_order() -> list[str]:
    """Six submitters queue up one by one; a seventh arrives as the first slot frees."""
    runs = Runs("model", queue_limit=1)
    runs.start(queued=True)  # the slot is taken: everyone after waits
    served: list[str] = []
    changed = threading.Condition()

    def submit(name: str) -> None:
        runs.start(queued=True)
        with changed:
            served.append(name)
            changed.notify_all()

    threads = []
    for i in range(6):
        thread = threading.Thread(target=submit, args=(f"t{i}",), daemon=True)
        thread.start()
        threads.append(thread)
        deadline = time.monotonic() + WAIT_S
        while runs.waiting < i + 1:  # in line before the next one arrives
            assert time.monotonic() < deadline, "a submitter never queued"
            time.sleep(0.001)
    for n in range(7):
        runs.finish(queued=True)  # one slot at a time: who gets it is who is served
        if n == 0:
            # Arrives as a slot frees, with six before it: it must not jump the line.
            late = threading.Thread(target=submit, args=("late",), daemon=True)
            late.start()
            threads.append(late)
        _until(changed, lambda: len(served) > n)  # noqa: B023 (called before n moves on)
    for thread in threads:
        thread.join(WAIT_S)
    assert runs.waiting == 0
    return served


def test_queued_runs_are_served_in_arrival_order() -> None:
    for _ in range(5):  # several threads contend for every freed slot, round after round
        assert _served_order() == [f"t{i}" for i in range(6)] + ["late"]


def _queue_up(
    runs: Runs, count: int
) -> tuple[list[threading.Thread], threading.Semaphore, list[EdgeAgentError]]:
    """`count` threads blocked in `runs.start(queued=True)`, all in line on return; each
    releases the semaphore when let in, or keeps the error it was turned away with."""
    admitted = threading.Semaphore(0)
    turned_away: list[EdgeAgentError] = []

    def blocked() -> None:
        try:
            runs.start(queued=True)
        except EdgeAgentError as exc:
            turned_away.append(exc)
            return
        admitted.release()

    waiters = [threading.Thread(target=blocked, daemon=True) for _ in range(count)]
    for thread in waiters:
        thread.start()
    deadline = time.monotonic() + WAIT_S
    while runs.waiting < count:
        assert time.monotonic() < deadline, "a submitter never queued"
        time.sleep(0.001)
    return waiters, admitted, turned_away


def test_a_free_slot_admits_at_once_and_close_turns_waiters_away() -> None:
    runs = Runs("model", queue_limit=2)
    started = time.perf_counter()
    runs.start(queued=True)
    runs.start(queued=True)
    assert time.perf_counter() - started < 0.05, "an uncontended start must not wait"
    waiters, _, errors = _queue_up(runs, 3)
    closer = threading.Thread(target=runs.close, daemon=True)
    closer.start()
    for thread in waiters:
        thread.join(WAIT_S)
        assert not thread.is_alive(), "a waiter was not woken by close"
    assert len(errors) == 3
    assert runs.waiting == 0
    runs.finish(queued=True)
    runs.finish(queued=True)
    closer.join(WAIT_S)
    assert not closer.is_alive()
    with pytest.raises(EdgeAgentError):
        runs.start(queued=True)


def test_a_full_queue_lets_its_waiters_in_at_half_and_then_all_that_fit() -> None:
    runs = Runs("model", queue_limit=4)
    for _ in range(4):
        runs.start(queued=True)
    waiters, admitted, turned_away = _queue_up(runs, 3)
    runs.finish(queued=True)  # 3 of 4 queued: above half, nobody is woken yet
    assert not admitted.acquire(timeout=0.2), "a waiter came in above the low-water mark"
    assert runs.waiting == 3
    runs.finish(queued=True)  # 2 of 4: the head comes in, and the next one after it
    assert admitted.acquire(timeout=WAIT_S)
    assert admitted.acquire(timeout=WAIT_S)
    assert not admitted.acquire(timeout=0.2), "a third waiter came in past the limit"
    assert runs.in_flight == 4
    assert runs.waiting == 1
    runs.close(timeout=0)  # turns the last waiter away
    for thread in waiters:
        thread.join(WAIT_S)
    assert len(turned_away) == 1


class _Engine(ThreadedModel):
    """A model whose runs take as long as the test says: `gate` lets them end."""

    def __init__(self) -> None:
        super().__init__("engine", workers=1)
        self.gate = threading.Event()
        self.started = threading.Event()
        self.released = False

    def _run(self, inputs: Mapping[str, Tensor]) -> Tensors:
        self.started.set()
        self.gate.wait(WAIT_S)
        return {}

    def _release(self) -> None:
        self.released = True


def test_close_waits_for_a_run_that_ends_and_then_frees_the_engine() -> None:
    engine = _Engine()
    engine.submit({}, lambda outputs, userdata, seconds: None, None)
    assert engine.started.wait(WAIT_S)
    threading.Timer(0.2, engine.gate.set).start()
    engine.close()
    assert engine.released


def test_wait_returns_when_the_last_run_ends_and_raises_what_failed() -> None:
    runs = Runs("model", queue_limit=4)
    runs.start(queued=True)
    runs.start(queued=True)
    returned = threading.Event()
    raised: list[BaseException] = []

    def wait() -> None:
        try:
            runs.wait()
        except BaseException as exc:
            raised.append(exc)
        returned.set()

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    assert not returned.wait(0.2), "two runs are still queued"
    runs.finish(queued=True, error=RuntimeError("the engine failed"))
    assert not returned.wait(0.2), "one run is still queued"
    runs.finish(queued=True)  # the last one: a run ending wakes the waiter, none is lost
    assert returned.wait(WAIT_S)
    assert [str(e) for e in raised] == ["the engine failed"]
    runs.wait()  # the error was handed over once; nothing queued, so it returns at once


def test_close_leaves_a_stuck_run_behind_after_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    # A run that never comes back (an engine stuck in C++) must not hang whoever closes
    # the model: close gives up after CLOSE_WAIT_S, and frees nothing the run may be using.
    monkeypatch.setattr(runs_module, "CLOSE_WAIT_S", 0.3)
    engine = _Engine()
    engine.submit({}, lambda outputs, userdata, seconds: None, None)
    assert engine.started.wait(WAIT_S)
    started = time.monotonic()
    engine.close()
    took = time.monotonic() - started
    assert 0.3 <= took < 2.0, f"close took {took:.2f} s"
    assert not engine.released
    with pytest.raises(EdgeAgentError):
        engine.submit({}, lambda outputs, userdata, seconds: None, None)  # closed all the same
    engine.gate.set()  # the stuck run ends after all: nothing is left to break


def _infer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("infer-")]


def test_workers_run_jobs_in_order_and_finish_them_before_they_stop() -> None:
    workers = runs_module.Workers(1, "infer")
    done: list[int] = []
    gate = threading.Event()
    workers.put(gate.wait, WAIT_S)  # holds the one thread while the rest queue up
    for i in range(5):
        workers.put(done.append, i)
    gate.set()
    workers.stop(wait=True)
    assert done == [0, 1, 2, 3, 4], "every job given before stop ran, in order"
    workers.stop(wait=True)  # a second stop is harmless
    with pytest.raises(RuntimeError):
        workers.put(done.append, 5)  # no thread is left to run it


def test_a_model_dropped_without_close_ends_its_threads() -> None:
    before = set(_infer_threads())
    engine = _Engine()
    engine.gate.set()
    finished = threading.Event()
    engine.submit({}, lambda outputs, userdata, seconds: finished.set(), None)
    assert finished.wait(WAIT_S)
    mine = [t for t in _infer_threads() if t not in before]
    assert mine, "the submit started a worker"
    engine.wait()
    del engine
    for thread in mine:
        thread.join(WAIT_S)
        assert not thread.is_alive(), "a dropped model's worker outlived it"


def test_the_interpreter_exits_with_a_model_left_open() -> None:
    # The workers are not daemons (a run is never cut off in the engine), so unless they
    # are told to stop as the interpreter exits, it would wait on them forever.
    code = (
        "import threading\n"
        "from edge_agent.runtime.runs import ThreadedModel\n"
        "class M(ThreadedModel):\n"
        "    def _run(self, inputs):\n"
        "        return {}\n"
        "KEEP = M('m', 2)\n"
        "KEEP.submit({}, lambda o, u, s: print('ran', flush=True), None)\n"
        "KEEP.wait()\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "ran\n"


def test_slots_lend_at_most_their_limit_and_a_failed_make_frees_its_place() -> None:
    made: list[object] = []
    fail = [True]

    def make() -> object:
        if fail[0]:
            fail[0] = False
            raise RuntimeError("the engine refused a request")
        made.append(object())
        return made[-1]

    slots: runs_module.Slots[object] = runs_module.Slots(make, 2)
    with pytest.raises(RuntimeError):
        slots.take()
    first, second = slots.take(), slots.take()  # the failed make did not use up a place
    assert len(made) == 2
    assert first is not second
    got: list[object] = []
    taker = threading.Thread(target=lambda: got.append(slots.take()))
    taker.start()
    taker.join(0.2)
    assert taker.is_alive(), "a third take waits while both are lent out"
    slots.give(second)
    taker.join(WAIT_S)
    assert got == [second], "the one given back, not a new one"
    assert len(made) == 2
    slots.give(first)
    assert slots.take() is first, "the one given back, not a new one"
    assert len(made) == 2
