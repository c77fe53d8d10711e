"""The audio pipeline: windows from a source through a stateful VAD, in order.

A recurrent model's state links each window to the one before, so windows run
one after another (no parallel requests); at 512 samples a window the model
costs well under a millisecond, far inside the 32 ms each window lasts.

A reader thread takes windows from the source into a short queue, and a worker
thread runs the model, the event rules and the sinks, while `run()` only
supervises (as the vision pipeline's caller does): `stop()` ends `run()` within
`stopping.STOP_BUDGET_S` even while a microphone read, the source's close, a sink
or the engine is blocked, and a model that has not returned for `stopping.ENGINE_STALL_S`
ends the pipeline with `inference.failed`.

Event rules follow the VAD's speech timeline, not the closing of segments, so
"appeared" and "gone" come as soon as the hysteresis decides, stamped with the
times speech started and ended.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from typing import Literal

import numpy as np

from edge_agent.catalog.manifest import Manifest
from edge_agent.errors import EdgeAgentError
from edge_agent.heads.base import Result, SpeechSegment
from edge_agent.heads.vad import SpeechMark, VadConfig, VadSegmenter
from edge_agent.logs import Throttle, error_text, log_event
from edge_agent.pipelines.base import (
    AudioChunk,
    AudioSource,
    Event,
    FrameResult,
    Sink,
    SourceError,
)
from edge_agent.pipelines.events import EventTracker
from edge_agent.pipelines.stopping import (
    ENGINE_STALL_S,
    GRACE_S,
    IDLE_POLL_S,
    POLL_S,
    StopFlag,
    stuck_engine,
)
from edge_agent.runtime.base import CompiledModel, CompileReport
from edge_agent.runtime.stateful import StatefulVad
from edge_agent.telemetry.stats import PipelineStats, PipelineTelemetry

log = logging.getLogger(__name__)

# Windows read ahead of the model: half a second at 32 ms a window.
_READ_AHEAD = 16
# How long a stopping `run()` waits for the source to close before leaving it to finish
# on its own; with the poll above, well inside the 2 s a stop may take.
_CLOSE_WAIT_S = 1.0
# A failing sink is logged at most this often, so a broken disk is one line a minute.
_SINK_LOG_EVERY_S = 60.0

# The tracker only asks whether speech is present, not where.
_SPEAKING: list[Result] = [SpeechSegment(start=0.0, end=0.0)]


def vad_config(manifest: Manifest) -> VadConfig:
    """The VAD head of an audio model, or a clear error for any other model."""
    if not isinstance(manifest.head, VadConfig):
        raise EdgeAgentError(
            f"{manifest.name} is not an audio model",
            "use a video or image source with it",
            code="model.incompatible",
        )
    return manifest.head


_Item = AudioChunk | BaseException | None


class _Reader:
    """Reads a source on its own thread into a bounded buffer, until the end or `halt()`.

    Every window the source returned is accounted for once: taken by `get`, counted by
    `halt` (buffered, never taken) or counted by `join` (returned by the source after the
    halt, when the stop closed it under a read).
    """

    def __init__(self, source: AudioSource, name: str) -> None:
        self._source = source
        self._cond = threading.Condition()
        self._items: collections.deque[_Item] = collections.deque()
        self._halted = False
        self._abandoned = 0  # windows read after the halt: never buffered
        self._thread = threading.Thread(target=self._run, name=f"read-{name}", daemon=True)
        self._thread.start()

    def get(self, timeout: float) -> _Item:
        """The next item, waiting up to `timeout`.

        Raises:
            queue.Empty: none came in time.
        """
        with self._cond:
            if not self._items:
                self._cond.wait(timeout)
            if not self._items:
                raise queue.Empty
            item = self._items.popleft()
            self._cond.notify_all()
            return item

    def halt(self) -> int:
        """Stop reading; returns how many windows were read but never taken."""
        with self._cond:
            self._halted = True
            left = sum(isinstance(item, AudioChunk) for item in self._items)
            self._items.clear()
            self._cond.notify_all()
            return left

    def join(self, timeout: float) -> int:
        """Wait up to `timeout` for the reading thread to end (after the source's close ends
        its read); returns the windows it read after `halt` and dropped."""
        self._thread.join(timeout)
        with self._cond:
            abandoned, self._abandoned = self._abandoned, 0
            return abandoned

    def _run(self) -> None:
        while True:
            item: _Item
            try:
                item = self._source.read()
            except BaseException as exc:  # handed to run(), which raises what is not a SourceError
                item = exc
            with self._cond:
                # Checked and put under one lock: a window is buffered before the halt
                # (and counted by it) or after it (and counted here), never lost between.
                while len(self._items) >= _READ_AHEAD and not self._halted:
                    self._cond.wait(POLL_S)
                if self._halted:
                    self._abandoned += isinstance(item, AudioChunk)
                    return
                self._items.append(item)
                self._cond.notify_all()
            if not isinstance(item, AudioChunk):
                return


class AudioPipeline:
    """One audio source, one stateful VAD model, event rules, sinks."""

    def __init__(
        self,
        name: str,
        source: AudioSource,
        model: CompiledModel,
        manifest: Manifest,
        sinks: list[Sink],
        telemetry: PipelineTelemetry,
        events: EventTracker,
        max_frames: int | None = None,
    ) -> None:
        self.name = name
        self.source = source
        self.telemetry = telemetry
        self.error: EdgeAgentError | None = None
        self.completed = False
        """The run processed the `max_frames` windows it was given: all that was asked of
        it. Never set by an end a mic's loss or a stop brings."""
        self.failures = 0
        """Sink calls that raised."""
        self._model = model
        self._config = vad_config(manifest)
        self._label = manifest.name
        self._sinks = sinks
        self._events = events
        self._max_frames = max_frames
        self._stop = StopFlag()
        self._sink_said = Throttle(_SINK_LOG_EVERY_S)  # per sink
        self._left = False  # run() gave up on the worker: it must send nothing more
        self._busy_since: float | None = None  # when the window in the engine went in
        self._holding = False  # the worker has taken a window it has not finished
        self._bug: BaseException | None = None
        self._reader: _Reader | None = None
        self._last_ts = 0.0  # stream time of the latest window taken
        self._closed = False
        self._close_lock = threading.Lock()
        # What the worker keeps open (the speech segment, presence), for run() to close if
        # it leaves the worker in the engine: left open, a stuck GPU or a stop during a
        # slow inference sent "appeared" with no "gone", and lost the segment so far.
        self._step_lock = threading.Lock()  # the segmenter and tracker, worker against run()
        self._segmenter: VadSegmenter | None = None
        self._done_to = 0.0  # stream time at the end of the last window processed
        self._done = 0  # windows processed

    def serving(self) -> tuple[str, CompileReport]:
        """The model that runs the stream, by name, and its compile report."""
        return self._label, self._model.report

    def stop(self) -> None:
        """Make `run` return within `stopping.STOP_BUDGET_S`, whatever the source, a sink
        or the engine does.

        Thread-safe, and safe to call from a signal handler.

        The window being processed finishes if it can within the grace; windows read but
        not yet processed, and one still held by a sink or the engine, count as dropped.
        """
        self._stop.set()

    def run(self) -> PipelineStats:
        """Process windows until the source ends, `max_frames`, `stop()`, or a source or
        engine error (left in `error`, as the vision pipeline leaves it).

        Raises:
            Exception: a bug in the source (anything but a SourceError), after cleaning up.
        """
        self.telemetry.reset()
        worker = threading.Thread(target=self._work, name=f"vad-{self.name}", daemon=True)
        worker.start()
        while True:
            # Seldom until a stop is asked (the join returns the moment the worker ends).
            worker.join(POLL_S if self._stop.is_set() else IDLE_POLL_S)
            if not worker.is_alive():
                break
            busy = self._busy_since
            if busy is not None and time.monotonic() - busy > ENGINE_STALL_S:
                self._engine_stuck(time.monotonic() - busy)
                break
            if self._stop.past_grace(GRACE_S):
                self._leave("dropped_on_stop")
                break
        if self._bug is not None:
            raise self._bug
        return self.telemetry.snapshot()

    def _engine_stuck(self, idle: float) -> None:
        """The window in the engine never came back: say so, and leave the worker in it."""
        self._stop.set()
        self._leave("frame_failures")
        self.error = stuck_engine(idle, "one audio window")
        log_event(
            log,
            logging.ERROR,
            "pipeline_error",
            pipeline=self.name,
            code=self.error.code,
            error=self.error.problem,
        )
        # The sinks are not what is stuck; they hear why the stream ended.
        ts = self._last_ts
        event = Event(kind="pipeline_error", ts=ts, detail=str(self.error), code=self.error.code)
        self._send(FrameResult(self.name, -1, ts, [], [event], {}, self._label))

    def _leave(self, counter: Literal["frame_failures", "dropped_on_stop"]) -> None:
        """Give up on the worker (a sink or the engine holds it): count the window it holds,
        stop the reading and close the source without waiting (a worker that wakes later
        sees `_left` and sends nothing more). Left in the engine, what it kept open is
        closed here and sent; a sink that holds it would hold that too."""
        in_engine = self._busy_since is not None
        with self._step_lock:
            self._left = True
            held = self._holding  # the worker settles its window under this lock too
            closed = self._close_open() if in_engine else None
        if closed is not None:
            self._send(closed)
        if held:
            self.telemetry.count(counter)
        reader = self._reader
        if reader is not None:
            self.telemetry.count("dropped_on_stop", reader.halt())
        self._close_source(wait=False)
        log_event(
            log,
            logging.WARNING,
            "pipeline_left_workers",
            pipeline=self.name,
            stuck=f"vad-{self.name}",
        )

    def _close_open(self) -> FrameResult | None:
        """The open speech segment and presence, closed at the end of the last window
        processed (`_step_lock` held, `_left` set: the worker steps nothing more)."""
        segmenter = self._segmenter
        if segmenter is None:
            return None
        tail = segmenter.finish()
        events = self._timeline(tail.marks) + self._events.flush(self._done_to)
        if not (tail.closed or events):
            return None
        # A segment cut off by the end belongs to no window: it gets the next number.
        index = self._done if tail.closed else -1
        return FrameResult(
            self.name, index, self._done_to, list(tail.closed), events, {}, self._label
        )

    def _work(self) -> None:
        try:
            self._process()
        except BaseException as exc:  # run() raises it, on its caller's thread
            self._bug = exc

    def _process(self) -> None:
        c = self._config
        segmenter = self._segmenter = VadSegmenter(c)
        vad = StatefulVad(self._model, c)
        context = np.zeros(c.context, dtype=np.float32)
        end_ts = 0.0
        count = 0
        bug: BaseException | None = None
        reader = self._reader = _Reader(self.source, self.name)
        try:
            while not self._stop.is_set() and (
                self._max_frames is None or count < self._max_frames
            ):
                try:
                    item = reader.get(POLL_S)
                except queue.Empty:
                    continue
                if item is None:
                    break
                if isinstance(item, SourceError):
                    self.error = item
                    break
                if isinstance(item, BaseException):
                    bug = item
                    break
                # Per window, so that interval telemetry shows a mic's overruns as they happen.
                self.telemetry.set_dropped(self.source.dropped)
                t0 = time.perf_counter()
                with self._step_lock:  # as `_leave` reads it: the window is counted once
                    left = self._left
                    self._holding = not left
                if left:  # run() gave up on a slow worker before it held this window
                    self.telemetry.count("dropped_on_stop")
                    return
                window = np.concatenate([context, item.samples])
                context = item.samples[-c.context :] if c.context else context
                t1 = time.perf_counter()
                self._last_ts = item.ts
                self._busy_since = time.monotonic()
                try:
                    probability = vad.step(window)
                except EdgeAgentError as exc:
                    # The engine refused the window (e.g. its GPU was reset): end as the
                    # vision pipeline does, with its code, so a mic is retried and the
                    # open segment and presence are closed below; raised out of run(), it
                    # was an "internal" crash that lost both and was never retried.
                    self._busy_since = None
                    if not self._settle("frame_failures"):
                        return
                    self.error = exc
                    break
                self._busy_since = None
                t2 = time.perf_counter()
                end_ts = item.ts + len(item.samples) / c.sample_rate
                with self._step_lock:
                    if self._left:
                        return  # run() gave up on this window, closed and told the sinks
                    # At the window's place in the stream: after a mic's overrun, counting
                    # windows put every segment early by the audio lost.
                    step = segmenter.step(probability, round(item.ts * c.sample_rate))
                    events = self._timeline(step.marks)
                    self._done_to, self._done = end_ts, count + 1
                self._emit(item, list(step.closed), events, t0, t1, t2)
                count += 1
            self.completed = self._max_frames is not None and count >= self._max_frames
        finally:
            unread = reader.halt()
            self._close_source(wait=True)
            # A window the closed source still returned: read, and never to be taken.
            unread += reader.join(_CLOSE_WAIT_S)
            if self._stop.is_set():
                # Read ahead but cut off by the stop; after max_frames they were never wanted.
                self.telemetry.count("dropped_on_stop", unread)
            self.telemetry.set_dropped(self.source.dropped)
        # The stream has ended for this pipeline, however it ended: close the open
        # segment and let absence clocks run to the end.
        with self._step_lock:
            if self._left:
                return  # run() has returned: it counted what the worker held, and closed
            self._left = True  # closed once: this worker steps nothing more
            closed = self._close_open()
        if closed is not None:
            self._send(closed)
        if self.error is not None:
            kind = "source_error" if isinstance(self.error, SourceError) else "pipeline_error"
            event = Event(kind=kind, ts=end_ts, detail=str(self.error), code=self.error.code)
            log_event(
                log,
                logging.ERROR,
                kind,
                pipeline=self.name,
                code=self.error.code,
                detail=str(self.error),
            )
            self._send(FrameResult(self.name, -1, end_ts, [], [event], {}, self._label))
        if bug is not None:
            raise bug

    def _timeline(self, marks: list[SpeechMark]) -> list[Event]:
        events: list[Event] = []
        for mark in marks:
            events += self._events.update(mark.ts, _SPEAKING if mark.speaking else [])
        return events

    def _close_source(self, wait: bool) -> None:
        # Once, from the worker at the end or from run() leaving it behind. A microphone's
        # close waits for arecord to exit; do not let it hold up a stop.
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        closer = threading.Thread(target=self.source.close, name=f"close-{self.name}", daemon=True)
        closer.start()
        if not wait:
            return
        closer.join(_CLOSE_WAIT_S)
        if closer.is_alive():
            log_event(log, logging.WARNING, "source_close_pending", pipeline=self.name)

    def _emit(
        self,
        chunk: AudioChunk,
        results: list[Result],
        events: list[Event],
        t0: float,
        t1: float,
        t2: float,
    ) -> None:
        t3 = time.perf_counter()
        timings = {
            "read": chunk.read_s,
            "preprocess": t1 - t0,
            "infer": t2 - t1,
            "postprocess": t3 - t2,
        }
        self._send(
            FrameResult(self.name, chunk.index, chunk.ts, results, events, timings, self._label)
        )
        if not self._settle(None):
            return  # run() left this window in a sink, and counted it dropped
        t4 = time.perf_counter()
        t = self.telemetry
        t.record("read", chunk.read_s)
        t.record("preprocess", t1 - t0)
        t.record("queue", 0.0)
        t.record("infer", t2 - t1)
        t.record("postprocess", t3 - t2)
        t.record("sink", t4 - t3)
        t.record("end_to_end", t4 - t0 + chunk.read_s)
        t.frame_done()

    def _settle(self, counter: Literal["frame_failures"] | None) -> bool:
        """The worker is done with its window: count it as `counter` (None: the caller counts
        it done). False, counting nothing, when run() has left the worker and counted the
        window itself: a sink that wakes after the stop's grace must not count it twice."""
        with self._step_lock:
            if self._left:
                return False
            self._holding = False
        if counter is not None:
            self.telemetry.count(counter)
        return True

    def _send(self, result: FrameResult) -> None:
        for sink in self._sinks:
            try:
                sink.emit(result)
            except Exception as exc:
                # The runner guards every sink; this is the backstop for a pipeline built
                # without it: one broken sink must neither stop the audio nor starve the rest.
                self.failures += 1
                self.telemetry.count("sink_failures")
                if self._sink_said.ready(id(sink)):
                    log_event(
                        log,
                        logging.WARNING,
                        "sink_failed",
                        pipeline=self.name,
                        sink=type(sink).__name__,
                        failures=self.failures,
                        error=error_text(exc),
                    )
