"""Bookkeeping both backends share: the runs in flight on one compiled model.

A pooled model is called from several pipelines' threads at once, and closed
by whichever lets go last. `Runs` admits runs until `close`, bounds how many
queued runs may wait, and serves the callers blocked on that bound first come,
first served (so no pipeline sharing the model starves another); it lets `wait`
block until the queued ones have called back, and hands a failed callback's
exception to the next `wait`. `Slots`
lends out engine objects (OpenVINO infer requests) one caller at a time.
`ThreadedModel` builds a backend's `CompiledModel` methods on the two.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Generic, Self, TypeVar

from edge_agent.errors import EdgeAgentError
from edge_agent.logs import log_event
from edge_agent.runtime.base import Done, Failed, Tensor, Tensors

T = TypeVar("T")

log = logging.getLogger(__name__)


def closed_error(model: str) -> EdgeAgentError:
    return EdgeAgentError(
        f"{model} was closed; it runs nothing more",
        "acquire the model again (a closed model's requests and memory are gone)",
        code="inference.failed",
    )


class Runs:
    """Counts a model's runs in flight; after `close` it admits none and waits for the rest."""

    def __init__(self, model: str, queue_limit: int | None = None) -> None:
        self.model = model
        self._limit = queue_limit
        # Callers blocked on the limit are woken only once the queue has drained to half,
        # and then come in one after another: a caller that keeps the queue full (bench, a
        # busy pipeline) wakes once for several runs instead of once a run. On a model that
        # runs in 0.2-0.5 ms each wake is a visible share of the CPU the engine could have
        # had: face-blazeface 4,537 against 4,305 FPS, text-orientation 1,906 against 1,865
        # (2 cores, alternating rounds). Half the queue still keeps every request busy.
        self._low_water = None if queue_limit is None else queue_limit // 2
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)  # `wait` and `close`: a run ended
        # Callers blocked on the queue limit, oldest first, each woken on its own turn:
        # one condition for all and notify_all would let any of them (or a newcomer) in.
        self._waiters: deque[threading.Condition] = deque()
        # Threads in `wait` or `close`, the only ones `_cond` wakes: a run that ends with none
        # of them skips the notify. With `Slots.give` skipping its own the same way, a
        # vad-silero run under the latency hint took 1.8% less (the median of 20 alternating
        # in-process rounds on 2 cores; 93.3 against 94.3 us, on a slow spell of the host).
        self._watchers = 0
        self._running = 0  # synchronous runs
        self._queued = 0  # submitted runs that have not called back yet
        self._closed = False
        self._error: BaseException | None = None

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def waiting(self) -> int:
        """Queued runs blocked on `queue_limit` right now."""
        return len(self._waiters)

    def start(self, queued: bool = False) -> None:
        """Admit one run; a queued run waits, in arrival order, while `queue_limit` are
        already queued (or others wait before it). Once it waits, it is let in when the
        queue has drained to half the limit.

        Raises:
            EdgeAgentError: the model is closed.
        """
        with self._lock:
            limit = self._limit if queued else None
            if limit is not None and not self._closed and (self._waiters or self._queued >= limit):
                self._wait_turn(limit)
            if self._closed:
                raise closed_error(self.model)
            if queued:
                self._queued += 1
            else:
                self._running += 1

    def finish(self, queued: bool = False, error: BaseException | None = None) -> None:
        """A run admitted by `start` is over; `error` is kept for the next `wait`."""
        with self._cond:
            if queued:
                self._queued -= 1
            else:
                self._running -= 1
            if error is not None and self._error is None:
                self._error = error
            if self._watchers:
                self._cond.notify_all()
            if queued and self._waiters and self._queued <= (self._low_water or 0):
                self._waiters[0].notify()

    def _wait_turn(self, limit: int) -> None:
        # Holding the lock: queue up, and leave once at the head with room (or closed).
        turn = threading.Condition(self._lock)
        self._waiters.append(turn)
        try:
            while not self._closed and (self._waiters[0] is not turn or self._queued >= limit):
                turn.wait()
        finally:
            self._waiters.remove(turn)
            # The next in line may have room too (several runs ended at once), or must
            # learn that the model closed.
            if self._waiters:
                self._waiters[0].notify()

    def wait(self) -> None:
        """Block until every queued run has called back; re-raise the first that failed."""
        with self._cond:
            while self._queued:
                self._watch(None)
            error, self._error = self._error, None
        if error is not None:
            raise error

    def close(self, timeout: float | None = None) -> tuple[bool, bool]:
        """Admit nothing more and wait for every run in flight, at most `timeout` seconds.

        Returns:
            Whether this was the first call, and whether every run ended in time.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            first = not self._closed
            self._closed = True
            for turn in self._waiters:  # queued callers blocked on the limit now raise
                turn.notify()
            while self._queued or self._running:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return first, False
                self._watch(left)
            return first, True

    def _watch(self, timeout: float | None) -> None:
        # Holding the lock: wait for a run to end, counted so that `finish` notifies.
        self._watchers += 1
        try:
            self._cond.wait(timeout)
        finally:
            self._watchers -= 1

    @property
    def in_flight(self) -> int:
        """Runs started and not yet finished, queued or synchronous."""
        with self._lock:
            return self._queued + self._running


class Slots(Generic[T]):
    """Up to `limit` engine objects, made on first need and lent to one caller at a time."""

    def __init__(self, make: Callable[[], T], limit: int) -> None:
        self._make = make
        self._limit = max(1, limit)
        self._made = 0
        self._free: list[T] = []
        self._cond = threading.Condition()
        self._waiting = 0  # callers blocked in `take`; `give` notifies only if there are any

    def take(self) -> T:
        """One object, for the caller alone until `give`; waits while all `limit` are lent out.

        `take` and `give`, not a context manager, on the hot path: a generator-based
        `with` costs about 1.4 us a run, a visible share of a 30 us one (vad-silero).
        """
        with self._cond:
            while not self._free and self._made >= self._limit:
                self._waiting += 1
                try:
                    self._cond.wait()
                finally:
                    self._waiting -= 1
            if self._free:
                return self._free.pop()
            self._made += 1
        try:
            return self._make()  # outside the lock: creating a request takes a while
        except BaseException:
            with self._cond:
                self._made -= 1
                if self._waiting:
                    self._cond.notify()
            raise

    def give(self, item: T) -> None:
        """Return an object from `take`."""
        with self._cond:
            self._free.append(item)
            if self._waiting:
                self._cond.notify()

    def clear(self) -> None:
        """Drop every object not lent out (call once nothing is lent)."""
        with self._cond:
            self._made -= len(self._free)
            self._free.clear()


class Workers:
    """`count` threads that run the jobs put to them, in order, until `stop`.

    What `ThreadPoolExecutor` does, less what a model's runs never use: no Future, and no
    pure-Python semaphore on each submit. Its per-run bookkeeping held the GIL for a
    visible share of a small model's run: text-orientation on ONNX Runtime, 2 cores,
    alternating 4 s rounds against two threads calling `run` themselves: 0.90-0.94x
    through the executor, 0.93-0.98x through this.

    The threads are not daemons, so a run in the engine is never cut off by the
    interpreter's exit; like the executor's, they are told to stop when the interpreter
    begins to exit, and finish the jobs already given first.
    """

    def __init__(self, count: int, name: str) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[..., object], tuple[object, ...]] | None]
        self._jobs = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._serve, name=f"{name}-{i}") for i in range(count)
        ]
        self._stopped = False
        _LIVE.add(self)
        for thread in self._threads:
            thread.start()

    def put(self, job: Callable[..., object], *args: object) -> None:
        """Queue `job(*args)`.

        Raises:
            RuntimeError: after `stop` (as an executor refuses work after shutdown).
        """
        if self._stopped:
            raise RuntimeError("the workers were stopped; they take no more jobs")
        self._jobs.put((job, args))

    def _serve(self) -> None:
        get = self._jobs.get
        while (item := get()) is not None:
            job, args = item
            job(*args)  # jobs catch their own exceptions (ThreadedModel._work)
            # Idle in `get`, the last job must not keep its model (and so these threads) alive.
            del item, job, args

    def stop(self, wait: bool) -> None:
        """Let each thread finish the jobs before this call, then end; `wait` joins them."""
        if not self._stopped:
            self._stopped = True
            for _ in self._threads:
                self._jobs.put(None)
        if wait:
            for thread in self._threads:
                if thread is not threading.current_thread():
                    thread.join()


_LIVE: weakref.WeakSet[Workers] = weakref.WeakSet()


def _stop_all() -> None:
    for workers in list(_LIVE):
        workers.stop(wait=False)


# Before the interpreter joins its non-daemon threads (atexit would be too late: it runs
# after that join, which would wait forever on idle workers). concurrent.futures does the same.
threading._register_atexit(_stop_all)  # type: ignore[attr-defined]


CLOSE_WAIT_S = 10.0
"""How long `close` waits for runs in flight. A run still going after it is stuck in the
engine (a pipeline gives up on one after stopping.ENGINE_STALL_S): the model is left to it,
its engine objects never freed under a thread that may still be inside them."""


class ThreadedModel:
    """`infer`, `submit`, `wait` and `close` over one `_run`, for both engines.

    Asynchronous runs go to this model's own worker threads, never to callbacks on
    the engine's threads: an OpenVINO callback that drops the last reference to a
    compiled model destroys it on the very thread its destructor then joins, and
    the process aborts. Here every Python object lives and dies on Python threads,
    and the engine releases the GIL while it computes, so nothing is lost to it.
    """

    def __init__(self, name: str, workers: int) -> None:
        self._workers = max(1, workers)
        # Two runs queued per worker keep each busy; more would only grow memory. At least
        # four, though: with one worker (the latency hint) a limit of two wakes a blocked
        # caller on every run, and its wake-up takes a core from the engine's threads in the
        # middle of the next run: face-blazeface under the latency hint, 2 cores,
        # alternating 2 s rounds, 0.89-0.91x of a bare `request.infer()` loop at two,
        # 0.93x at four or eight. A pipeline's own window still bounds its frames in flight.
        self._runs = Runs(name, queue_limit=max(4, 2 * self._workers))
        self._pool: Workers | None = None  # made on the first submit
        self._pool_lock = threading.Lock()
        self._local = threading.local()  # `in_done` is set while a worker runs a `done`

    def _run(self, inputs: Mapping[str, Tensor]) -> Tensors:
        """One run on the engine; raises EdgeAgentError (inference.failed) if it fails."""
        raise NotImplementedError

    def _release(self) -> None:
        """Free the engine's objects; called once, with nothing in flight."""

    def infer(self, inputs: Mapping[str, Tensor]) -> Tensors:
        # `start` and `finish` by hand: a generator-based context manager around them cost
        # 4.5 us a run, a visible share of vad-silero's 0.1 ms under the latency hint.
        self._runs.start()
        try:
            return self._run(inputs)
        finally:
            self._runs.finish()

    def submit(
        self,
        inputs: Mapping[str, Tensor],
        done: Done,
        userdata: object,
        failed: Failed | None = None,
    ) -> None:
        self._runs.start(queued=True)  # blocks while the workers have enough queued
        try:
            pool = self._pool
            if pool is None:
                with self._pool_lock:
                    if self._pool is None:
                        self._pool = Workers(self._workers, "infer")
                        # A model dropped without `close` must not leave its threads idle
                        # until the process ends.
                        weakref.finalize(self, self._pool.stop, False)
                    pool = self._pool
            pool.put(self._work, inputs, done, userdata, failed)
        except BaseException:
            self._runs.finish(queued=True)
            raise

    def _work(
        self,
        inputs: Mapping[str, Tensor],
        done: Done,
        userdata: object,
        failed: Failed | None = None,
    ) -> None:
        error: BaseException | None = None
        try:
            started = time.perf_counter()
            try:
                outputs = self._run(inputs)
            except Exception as exc:
                if failed is None:
                    raise
                # Told to the caller, who waits on no `wait`: kept for one, a pipeline's
                # frame was owed for 10 s and the engine's error never said.
                self._local.in_done = True
                failed(exc, userdata)
                return
            self._local.in_done = True
            done(outputs, userdata, time.perf_counter() - started)
        except BaseException as exc:  # a worker has no caller: `wait` raises it
            error = exc
        finally:
            self._local.in_done = False
            self._runs.finish(queued=True, error=error)

    def wait(self) -> None:
        self._runs.wait()

    def close(self) -> None:
        if getattr(self._local, "in_done", False):
            # Called from a `done` (a pipeline letting go on its last frame): this very
            # run is still in flight, so waiting here would wait for ourselves.
            threading.Thread(target=self.close, name="close-model", daemon=True).start()
            return
        first, drained = self._runs.close(CLOSE_WAIT_S)
        if not first:
            return
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if not drained:
            log_event(
                log,
                logging.WARNING,
                "model_abandoned",
                model=self._runs.model,
                runs_in_flight=self._runs.in_flight,
                waited_s=CLOSE_WAIT_S,
            )
            if pool is not None:
                pool.stop(wait=False)
            return
        if pool is not None:
            pool.stop(wait=True)
        self._release()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
