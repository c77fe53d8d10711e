"""Long commands as jobs: one at a time, with progress, cancel and a deadline.

Deploys and calibrations change what a box runs, so they are serialised: one
runs, the rest wait in order. A job that fails frees the queue at once; a job
that hangs past its deadline is cancelled and abandoned (its thread is a
daemon and is told to stop at its next check), and the next job starts on a
fresh worker, so a stuck deployment never blocks the next one (the bug
Greengrass users report as aws-greengrass-nucleus #1203).

A job that is about to change the store calls `JobContext.commit()`: from then on a
cancel is refused as too late, because the change goes through whatever the answer
says. A cancel answered ok while the model still went live told the console a lie.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from edge_agent.errors import EdgeAgentError
from edge_agent.logs import log_crash, log_event

log = logging.getLogger(__name__)

ProgressFn = Callable[[str, float], None]


@dataclass
class JobContext:
    """What a running command sees: a progress reporter and a cancel flag."""

    progress: ProgressFn
    _cancel: threading.Event = field(default_factory=threading.Event)
    _committed: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _expired: float | None = None
    """The deadline, in seconds, once the job ran past it (`expire`)."""
    _stopped: bool = False
    """Told to stop because the agent stops (`stop`), not cancelled by anyone."""
    _ended: bool = False
    """Its outcome is known and being answered (`end`): there is nothing left to cancel."""

    @classmethod
    def detached(cls) -> JobContext:
        """For short commands: progress goes nowhere, nothing cancels them."""
        return cls(lambda _stage, _fraction: None)

    @property
    def cancelled(self) -> bool:
        """True once cancel was asked for."""
        return self._cancel.is_set()

    @property
    def cancel_event(self) -> threading.Event:
        """The flag itself, for code that waits on it."""
        return self._cancel

    def check(self) -> None:
        """Raise command.cancelled if cancel was asked for, or the deadline passed; call
        between steps."""
        if not self._cancel.is_set():
            return
        if self._expired is not None:
            # Said as what it was: a bare "cancelled" answered a console that asked for no
            # cancel, and the operator took it for someone else's.
            raise EdgeAgentError(
                f"cancelled: ran past the agent's job deadline of {self._expired:g} s, and "
                "the queue moved on without it",
                "give it less to do (fewer samples, a recipe without accuracy control for a "
                "calibration), then send it again",
                code="command.cancelled",
            )
        raise EdgeAgentError("cancelled", code="command.cancelled")

    @property
    def stopped(self) -> bool:
        """True when the agent's stop, not a cancel, is what stops the job."""
        return self._stopped

    def stop(self) -> None:
        """Stop the job at its next check because the agent stops (bar a committed one).

        Its command.cancelled is then answered command.interrupted: "cancelled" told a
        console that asked for no cancel that an operator had, and it did not send again.
        """
        with self._lock:
            if self._committed or self._ended or self._cancel.is_set():
                return  # a cancel asked first stays the answer
            self._stopped = True
            self._cancel.set()

    def expire(self, deadline_s: float) -> None:
        """Stop the job at its next check, saying it ran past `deadline_s`."""
        self._expired = deadline_s
        self._cancel.set()

    def commit(self) -> None:
        """Pass the point of no return: call right before the first lasting change.

        Raises:
            EdgeAgentError: command.cancelled, if cancel came first (nothing changed yet).
        """
        with self._lock:
            # Once past it, past it: a deadline's cancel (which does not ask) between a
            # deploy's install and its activation must not make it answer cancelled.
            if not self._committed:
                self.check()
            self._committed = True

    def end(self) -> None:
        """Say the job's outcome is known: from now on there is nothing to cancel."""
        with self._lock:
            self._ended = True

    @property
    def ended(self) -> bool:
        """True once `end` was called."""
        return self._ended

    def request_cancel(self) -> bool:
        """Ask the job to stop; False, and nothing asked, once it has committed or ended."""
        with self._lock:
            if self._committed or self._ended:
                return False
            self._cancel.set()
            return True


@dataclass
class _Job:
    id: str
    run: Callable[[JobContext], None]
    context: JobContext
    started: float = 0.0


class Jobs:
    """A serial queue of long commands.

    Args:
        deadline_s: A job running longer is cancelled and the queue moves on.
    """

    def __init__(self, deadline_s: float = 1800.0) -> None:
        self.deadline_s = deadline_s
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._queue: collections.deque[_Job] = collections.deque()
        self._running: _Job | None = None
        # Left behind at their deadline, still running until they hear the cancel: listed
        # with the rest, so get_status shows a job stuck in native code, a cancel finds it
        # and a resend of its id is told it runs, instead of all three losing sight of it.
        self._abandoned: list[_Job] = []
        self._worker: threading.Thread | None = None
        self._closed = False
        self._stopping = False

    def start(self, job_id: str, run: Callable[[JobContext], None], progress: ProgressFn) -> None:
        """Queue a job; it runs after those before it.

        Raises:
            EdgeAgentError: command.interrupted once `cancel_all` ran (the agent stops):
                queued then, the job ran uncancelled while the pipelines closed.
        """
        with self._lock:
            if self._stopping:
                raise stopping_error(job_id)
            self._queue.append(_Job(job_id, run, JobContext(progress)))
            self._ensure_worker()
            self._wake.notify_all()

    def _ensure_worker(self) -> None:
        if self._worker is None or not self._worker.is_alive():
            self._worker = threading.Thread(target=self._loop, name="jobs", daemon=True)
            self._worker.start()

    def _loop(self) -> None:
        me = threading.current_thread()
        while True:
            with self._lock:
                while not self._queue and not self._closed:
                    self._wake.wait(timeout=1.0)
                    if self._worker is not me:
                        return
                if self._closed or self._worker is not me:
                    return
                job = self._queue.popleft()
                job.started = time.monotonic()
                self._running = job
            watchdog = threading.Timer(self.deadline_s, self._expire, args=(job, me))
            watchdog.daemon = True
            watchdog.start()
            try:
                job.run(job.context)
            except Exception:
                # run() answers the command itself; anything escaping is a bug, logged here.
                log_crash(log, "job_crashed", command_id=job.id)
            finally:
                watchdog.cancel()
            with self._lock:
                if job in self._abandoned:
                    self._abandoned.remove(job)
                if self._worker is not me:
                    return  # abandoned after its deadline: a fresh worker owns the queue
                self._running = None

    def _expire(self, job: _Job, worker: threading.Thread) -> None:
        with self._lock:
            if self._running is not job:
                return
            log_event(
                log, logging.ERROR, "job_deadline", command_id=job.id, deadline_s=self.deadline_s
            )
            job.context.expire(self.deadline_s)
            self._abandoned.append(job)
            self._running = None
            self._worker = None
            if self._queue:
                self._ensure_worker()

    def cancel(self, job_id: str) -> Literal["queued", "running"] | None:
        """Cancel a job: "queued" when it had not started (it is taken off the queue, never
        to run: the caller answers it), "running" when it was asked to stop, None when
        there is none by that id.

        Raises:
            EdgeAgentError: command.busy when the job has passed its point of no return.
        """
        with self._lock:
            queued = next((j for j in self._queue if j.id == job_id), None)
            if queued is not None:
                # Off the queue at once: left there, it held a slot and its answer until
                # every job ahead of it had run (up to their deadlines, 30 minutes each).
                self._queue.remove(queued)
                queued.context.request_cancel()
                return "queued"
            jobs = [*self._abandoned, self._running]
            job = next((j for j in jobs if j is not None and j.id == job_id), None)
            if job is None:
                return None
            if not job.context.request_cancel():
                if job.context.ended:
                    return None  # it ended as the cancel came: its own answer says how
                raise EdgeAgentError(
                    f"command {job_id} is past its point of no return: it is changing the "
                    "model store, and that change goes through",
                    "wait for its final answer, then undo it if unwanted (rollback_model, "
                    "remove_model)",
                    code="command.busy",
                )
            return "running"

    def running(self) -> list[str]:
        """Ids of the jobs left running past their deadline, the running job and the queued
        ones, in order."""
        with self._lock:
            head = [self._running.id] if self._running is not None else []
            return [job.id for job in self._abandoned] + head + [job.id for job in self._queue]

    def cancel_all(self) -> list[str]:
        """Stop the running job (bar a committed one), take the queued ones off the queue
        and take no more; returns the queued ids, never run, for the caller to answer.

        Left queued, each was started on the way out only to cancel itself, and answered
        command.cancelled as if an operator had cancelled it.
        """
        with self._lock:
            self._stopping = True
            if self._running is not None:
                self._running.context.stop()
            queued = [job.id for job in self._queue]
            for job in self._queue:
                job.context.stop()
            self._queue.clear()
            return queued

    def join(self, timeout: float) -> None:
        """Stop the worker once the queue is empty, waiting at most `timeout`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if self._running is None and not self._queue:
                    break
            time.sleep(0.02)
        with self._lock:
            self._closed = True
            self._wake.notify_all()


def stopping_error(command_id: str) -> EdgeAgentError:
    """The answer to a command that came while the agent stops: not run, not kept."""
    return EdgeAgentError(
        f"command {command_id} was not run: the agent is stopping",
        "send it again once the agent is back (the same id may be used)",
        code="command.interrupted",
    )
