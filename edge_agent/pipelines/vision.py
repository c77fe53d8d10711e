"""The vision pipeline: read frames, keep every infer request busy, emit in order.

Three kinds of thread share the work so none waits on another more than it must:
- a reader thread takes a slot in the window of frames in flight, then reads a
  frame and submits it: waiting for the slot before reading means a live source
  hands over its newest frame at capacity, not one that aged in the wait;
- the engine's threads run inference and hand outputs back;
- an emitter thread puts results back in frame order, decodes them, applies
  event rules and feeds the sinks; it is the sinks' only caller.
A semaphore bounds frames in flight, so a slow sink slows reading (a file) or
makes a live source drop its oldest frames, instead of growing memory.

The caller's thread only supervises, so `stop()` is kept within
`stopping.STOP_BUDGET_S` whatever the others are stuck in (see `stopping`).

A model swap is applied between two submits: frames already in flight finish
on the old model and decode with its head, the next frame goes to the new one;
the old model is retired as soon as its last frame has been emitted.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

from edge_agent.errors import EdgeAgentError
from edge_agent.logs import Throttle, error_text, log_crash, log_event
from edge_agent.pipelines.active import ActiveModel
from edge_agent.pipelines.base import Event, Frame, FrameResult, FrameSource, Sink, SourceError
from edge_agent.pipelines.detect import Detector
from edge_agent.pipelines.events import EventTracker
from edge_agent.pipelines.flight import Call, End, InFlight, InputBuffers, Retire
from edge_agent.pipelines.guard import guard_sinks
from edge_agent.pipelines.stopping import (
    ENGINE_STALL_S,
    GRACE_S,
    IDLE_POLL_S,
    StopFlag,
    acquire_unless,
    stuck_engine,
    supervise,
)
from edge_agent.runtime.base import CompiledModel, CompileReport, Tensors
from edge_agent.telemetry.stats import PipelineStats, PipelineTelemetry

log = logging.getLogger(__name__)

_FRAME_FAILED_LOG_S = 60.0
"""A pipeline's frames failing in its head are logged at most this often (with a count)."""

OnRetire = Callable[[CompiledModel], None]
"""Called, off the hot path, with a model that no frame will use again."""

ENGINE_FAILURES_END = 10
"""Frames in a row whose run raised that end the pipeline with the engine's error (a device
lost fails every run; one failed run is a failed frame, and the next goes on)."""
STALL_S = 10.0
"""A frame the engine has not returned after this long, while later ones have, is lost."""


_Done = tuple[InFlight, float]
"""A frame whose calls are all back, and when the last came back."""


class VisionPipeline:
    """One source, one model (swappable), event rules, sinks."""

    def __init__(
        self,
        name: str,
        source: FrameSource,
        active: ActiveModel,
        sinks: list[Sink],
        telemetry: PipelineTelemetry,
        events: EventTracker,
        max_frames: int | None = None,
        on_retire: OnRetire | None = None,
        grace_s: float = GRACE_S,
        detector: Detector | None = None,
    ) -> None:
        self.name = name
        self.source = source
        self.telemetry = telemetry
        self.error: EdgeAgentError | None = None
        self.completed = False
        """The run read the `max_frames` it was given: all that was asked of it. Never set
        by an end a live source's loss or a stop brings."""
        self._last_ts = 0.0
        self._active = active
        self._sinks = guard_sinks(sinks, name, lambda: telemetry.count("sink_failures"))
        self._events = events
        self._detector = detector or Detector()
        self._buffers = InputBuffers()
        telemetry.mode = self._detector.mode
        self._max_frames = max_frames
        self._on_retire = on_retire
        self._grace_s = grace_s
        self._pending: ActiveModel | None = None
        self._swap_lock = threading.Lock()
        self._stop = StopFlag()
        self._done: queue.SimpleQueue[_Done | Event | End | Retire] = queue.SimpleQueue()
        self._window = threading.BoundedSemaphore(max(2, 2 * active.model.report.requests + 2))
        # The model of the last frame emitted (the emitter's own): the first frame of
        # another carries the model_swapped event. Put on the next frame out when the
        # swap was taken, it landed on a frame the old model had decoded, and a second
        # swap taken between the emitter's read and clear of a shared list was lost.
        self._shown: ActiveModel | None = None
        # Frames submitted vs settled (emitted, failed or lost); `_left` is set once, when
        # run() gives up on the workers, and whatever is unsettled then was dropped.
        self._count_lock = threading.Lock()
        self._submitted = 0
        self._settled = 0
        self._left = False
        self._emitter_crashed = False
        self._stalled: EdgeAgentError | None = None  # set once, by the emitter
        # A head that fails on every frame fails 30 times a second, for as long as it runs:
        # the first is logged, then a line a minute with how many since.
        self._failed_said = Throttle(_FRAME_FAILED_LOG_S)
        self._failed_unsaid = 0
        self._engine_failures = 0  # frames in a row whose run raised; the emitter's own

    def request_swap(self, active: ActiveModel) -> None:
        """Run `active` from the next frame on; thread-safe, returns at once.

        A swap asked for before the last one was taken replaces it, and the model it
        replaces, which never ran a frame, is given back at once: two swaps landing while
        the reader waits (a camera reconnecting, a low fps_cap) kept the first one's model
        until the pipeline stopped.
        """
        with self._swap_lock:
            replaced, self._pending = self._pending, active
        if replaced is not None:
            self._retire(replaced.model)

    def notify(self, event: Event) -> None:
        """Send `event` to the sinks now, between frames; thread-safe (sources call it)."""
        self._done.put(event.model_copy(update={"ts": self._last_ts}))

    def stop(self) -> None:
        """Make `run` return within 2 s: frames in flight finish or are dropped and counted.

        Thread-safe, and safe to call from a signal handler (it takes no lock).
        """
        self._stop.set()

    def run(self) -> PipelineStats:
        """Process frames until the source ends, `max_frames`, `stop()` or a source error."""
        # FPS counts from the first frame, not from when the model was compiled.
        self.telemetry.reset()
        reader = threading.Thread(target=self._read_loop, name=f"read-{self.name}", daemon=True)
        emitter = threading.Thread(target=self._emit_loop, name=f"emit-{self.name}", daemon=True)
        emitter.start()
        reader.start()
        # The emitter ends last: after the reader's end marker and the last frame.
        finished = supervise(emitter, self._stop, self._grace_s) and not self._emitter_crashed
        if finished:
            # The reader is only closing its source now; wait for it within the same budget.
            finished = supervise(reader, self._stop, self._grace_s)
        else:
            self._stop.set()
        if not finished:
            self._leave(reader, emitter)
        if self.error is None and self._stalled is not None:
            self.error = self._stalled
        return self.telemetry.snapshot()

    def _halted(self) -> bool:
        return self._stop.is_set() or self._left or self._emitter_crashed

    def _leave(self, reader: threading.Thread, emitter: threading.Thread) -> None:
        """Give up on workers still busy; count what they held as dropped, or failed."""
        with self._count_lock:
            self._left = True
            unsettled = self._submitted - self._settled
        if self._emitter_crashed:
            self.telemetry.count("frame_failures", unsettled)
        else:
            self.telemetry.count("dropped_on_stop", unsettled)
        stuck = [t.name for t in (reader, emitter) if t.is_alive()]
        if reader.is_alive() and getattr(self.source, "interruptible", False):
            # The reader waits in the source's read() (a camera that is down): closed, that
            # read ends at once and the reader with it. Left open, the source went on
            # reconnecting to the camera for up to its give-up time after the pipeline
            # stopped, beside the one a restart opened. On a thread of its own: close()
            # joins the source's thread, and run() must return within its budget.
            threading.Thread(
                target=self.source.close, name=f"close-{self.name}", daemon=True
            ).start()
        log_event(
            log,
            logging.WARNING,
            "pipeline_left_workers",
            pipeline=self.name,
            stuck=",".join(stuck) or "none",
            unsettled=unsettled,
        )

    # --- reader thread ----------------------------------------------------------------
    def _read_loop(self) -> None:
        seq = 0
        error: EdgeAgentError | None = None
        # A camera replaces frames from its opening: those it replaced before the run (the
        # other pipelines of a group built, a model compiled) were not dropped by this run.
        before = self.source.dropped
        try:
            while not self._halted() and (self._max_frames is None or seq < self._max_frames):
                if not acquire_unless(self._window, self._halted):
                    break
                self._take_swap(seq)
                try:
                    frame = self.source.read()
                except SourceError as exc:
                    self._window.release()
                    error = exc
                    break
                if frame is None:
                    self._window.release()
                    break
                # Per frame, so that interval telemetry shows drops as they happen.
                self.telemetry.set_dropped(self.source.dropped - before)
                if self._halted() or not self._submit(seq, frame):
                    self.telemetry.count("dropped_on_stop")
                    break
                seq += 1
            self.completed = self._max_frames is not None and seq >= self._max_frames
        except EdgeAgentError as exc:
            # The engine refused a frame (e.g. its device went away): end like a source error.
            error = exc
        except Exception as exc:
            log_crash(log, "reader_crashed", pipeline=self.name)
            error = EdgeAgentError(f"the pipeline failed: {error_text(exc)}", code="internal")
        finally:
            if error is not None:
                self.error = error
            self._done.put(End(seq, error))
            try:
                # Closed first: a player thread (realtime files, cameras) may drop one more
                # frame until then, and the count must be the source's last word.
                self.source.close()
                self.telemetry.set_dropped(self.source.dropped - before)
            except Exception as exc:
                log_event(
                    log,
                    logging.WARNING,
                    "source_close_failed",
                    pipeline=self.name,
                    error=error_text(exc),
                )

    def _take_swap(self, seq: int) -> None:
        with self._swap_lock:
            pending, self._pending = self._pending, None
        if pending is None:
            return
        old, self._active = self._active, pending
        self._done.put(Retire(seq - 1, old.model))
        log_event(
            log,
            logging.INFO,
            "model_swapped",
            pipeline=self.name,
            old=old.label,
            model=pending.label,
        )

    def _submit(self, seq: int, frame: Frame) -> bool:
        """Plan, fit and submit `frame`, whose window slot the reader holds."""
        active = self._active
        self._last_ts = frame.ts
        t0 = time.perf_counter()
        started = t0 - frame.read_s
        # Planning (motion, regions) and fitting here make the "preprocess" stage; the
        # backend then finds each input already at the model's size and copies nothing
        # (but a uint8 RGB model's colour swap, openvino_backend.host_swaps_colour).
        item = InFlight(seq, frame, active, started, self._detector.plan(frame, active.image))
        inputs = [self._buffers.take(g) for g in item.calls]
        for geometry, buffer in zip(item.calls, inputs, strict=True):
            geometry.prepare(frame.image, buffer)
        item.submitted = time.perf_counter()
        item.prepare_s = item.submitted - t0
        with self._count_lock:
            if self._left:
                return False
            self._submitted += 1
        if not item.calls:
            # Nothing to look at (a still scene between sweeps): straight to the emitter.
            self._done.put((item, item.submitted))
        for index, buffer in enumerate(inputs):
            # Parallel requests: the engine runs a frame's tiles or regions side by side.
            name = active.image.name
            active.model.submit(
                {name: buffer[None]}, self._completed, Call(item, index, buffer), self._call_failed
            )
        return True

    def _call_failed(self, error: BaseException, userdata: object) -> None:
        # Engine thread: the frame is settled as failed, in order, by the emitter.
        assert isinstance(userdata, Call)
        self._buffers.give(userdata.buffer)
        if userdata.frame.call_failed(error):
            self._done.put((userdata.frame, time.perf_counter()))

    def _completed(self, outputs: Tensors, userdata: object, infer_s: float) -> None:
        # Engine thread: hand over and return at once, the emitter does the rest.
        assert isinstance(userdata, Call)
        self._buffers.give(userdata.buffer)
        if userdata.frame.call_done(userdata.index, outputs, infer_s):
            self._done.put((userdata.frame, time.perf_counter()))

    # --- emitter thread ---------------------------------------------------------------
    def _emit_loop(self) -> None:
        try:
            if self._drain():
                self._finish()
        except BaseException as exc:
            # A bug here must not leave the reader waiting for a slot: run() sees the flag.
            # The error too: with none, the run ended as a file that played out, and the
            # agent never retried the camera.
            if self.error is None:
                self.error = EdgeAgentError(
                    f"pipeline {self.name} failed: {error_text(exc)}",
                    "a bug: the agent's log has its traceback; report it",
                    code="internal",
                )
            self._emitter_crashed = True
            log_crash(log, "emitter_crashed", pipeline=self.name)

    def _drain(self) -> bool:
        """Emit frames in order until the reader's last one; False when run() left first."""
        waiting: dict[int, _Done] = {}
        retiring: list[Retire] = []
        expected = 0
        end: End | None = None
        progress = time.monotonic()
        while not self._left:
            try:
                # Frames, the reader's end mark and retirements all come through the queue;
                # the timeout only serves the stall checks and a run() that left.
                item = self._done.get(timeout=IDLE_POLL_S)
            except queue.Empty:
                owed = waiting or (end is not None and expected < end.submitted)
                idle = time.monotonic() - progress
                if owed and idle > STALL_S:
                    # Later frames came back, this one never will: count it lost, go on.
                    self._settle(lost=True)
                    expected += 1
                    progress = time.monotonic()
                elif idle > ENGINE_STALL_S and self._engine_stuck(idle):
                    return True
            else:
                if isinstance(item, Event):
                    self._send(FrameResult(self.name, -1, item.ts, [], [item], {}, self._label()))
                elif isinstance(item, End):
                    end = item
                elif isinstance(item, Retire):
                    retiring.append(item)
                elif item[0].seq >= expected:
                    waiting[item[0].seq] = item
                progress = time.monotonic()
            while expected in waiting:
                self._emit_safely(waiting.pop(expected))
                expected += 1
            for mark in [m for m in retiring if m.last < expected]:
                retiring.remove(mark)
                self._retire(mark.model)
            if end is not None and expected >= end.submitted:
                return True
        return False

    def _engine_stuck(self, idle: float) -> bool:
        """Nothing came back for `idle` seconds: if frames are in flight, the engine is
        stuck. Fail what it holds, stop the reader, and end; True when that happened."""
        with self._count_lock:
            unsettled = self._submitted - self._settled
            if unsettled == 0:
                return False  # a slow source, not a stuck engine
            self._left = True  # the reader submits nothing more
            self._settled = self._submitted
        self.telemetry.count("frame_failures", unsettled)
        self._stalled = stuck_engine(idle, f"{unsettled} frames in flight")
        self._stop.set()
        return True

    def _finish(self) -> None:
        """End of stream: close open presences, report the error, close the sinks."""
        self._detector.close()
        gone = self._events.flush(self._last_ts)
        if gone:
            self._send(FrameResult(self.name, -1, self._last_ts, [], gone, {}, self._label()))
        error = self.error or self._stalled
        if error is not None:
            self._emit_error(error)
        for sink in self._sinks:
            sink.close()

    def _settle(self, *, lost: bool = False) -> None:
        if lost:
            self.telemetry.count("frame_failures")
        self._window.release()
        with self._count_lock:
            self._settled += 1

    def _retire(self, model: CompiledModel) -> None:
        if self._on_retire is None:
            return
        try:
            self._on_retire(model)
        except Exception as exc:
            log_event(
                log, logging.WARNING, "retire_failed", pipeline=self.name, error=error_text(exc)
            )

    def _label(self) -> str:
        return self._active.label

    def serving(self) -> tuple[str, CompileReport]:
        """The model that runs the next frame, by name, and its compile report."""
        active = self._active
        return active.label, active.model.report

    def _emit_safely(self, item: _Done) -> None:
        # A head that fails on one frame must not stop the pipeline (or hang the
        # reader waiting for a free slot): log it, count it, go on.
        error = item[0].error  # the engine's, when a run of the frame raised
        if error is not None:
            self._engine_failed(error)
        else:
            self._engine_failures = 0
            try:
                self._emit(*item)
            except Exception as exc:
                error = exc
        if error is not None:
            self._failed_unsaid += 1  # the emitter's thread alone
            if self._failed_said.ready():
                log_event(
                    log,
                    logging.WARNING,
                    "frame_failed",
                    pipeline=self.name,
                    model=item[0].active.label,
                    frame=item[0].frame.index,
                    failures=self._failed_unsaid,
                    error=error_text(error),
                )
                self._failed_unsaid = 0
        self._settle(lost=error is not None)

    def _engine_failed(self, error: BaseException) -> None:
        """A frame's run raised: after ENGINE_FAILURES_END in a row (a device that went
        away fails every run), end the pipeline with the engine's own error."""
        self._engine_failures += 1
        if self._engine_failures < ENGINE_FAILURES_END or self.error is not None:
            return
        self.error = (
            error
            if isinstance(error, EdgeAgentError)
            else EdgeAgentError(
                f"inference failed: {error_text(error)}",
                "see the agent's log; check the device the model runs on",
                code="inference.failed",
            )
        )
        self._stop.set()

    def _emit(self, item: InFlight, finished: float) -> None:
        t0 = time.perf_counter()
        frame, head = item.frame, item.active.head
        parts = [
            (g, head.decode(out, g.model_size))
            for g, out in zip(item.calls, item.outputs, strict=True)
            if out is not None
        ]
        results, zones = self._detector.combine(frame, item.active.image, parts)
        events = self._events.update(frame.ts, results, zones)
        shown, self._shown = self._shown, item.active
        if shown is not None and shown is not item.active:
            detail = f"{shown.label} -> {item.active.label}"
            events = [Event(kind="model_swapped", ts=frame.ts, detail=detail), *events]
        decoded = time.perf_counter()
        timings = {
            "read": frame.read_s,
            "preprocess": item.prepare_s,
            "queue": max(0.0, finished - item.submitted - item.infer_s),
            "infer": item.infer_s,
            "postprocess": decoded - t0,
        }
        result = FrameResult(
            pipeline=self.name,
            frame=frame.index,
            ts=frame.ts,
            results=list(results),
            events=events,
            timings=timings,
            model=item.active.label,
            image=frame.image,
            source=frame.source,
            calls=len(item.calls),
            scale=frame.scale,
            zones=zones,
        )
        self._send(result)
        done = time.perf_counter()
        t = self.telemetry
        for stage, seconds in timings.items():
            t.record(stage, seconds)
        t.record("sink", done - decoded)
        t.record("end_to_end", done - item.started)
        t.frame_done(len(item.calls))

    def _emit_error(self, error: EdgeAgentError) -> None:
        kind = "source_error" if isinstance(error, SourceError) else "pipeline_error"
        event = Event(kind=kind, ts=self._last_ts, detail=str(error), code=error.code)
        log_event(
            log, logging.ERROR, kind, pipeline=self.name, code=error.code, error=error.problem
        )
        self._send(FrameResult(self.name, -1, self._last_ts, [], [event], {}, self._label()))

    def _send(self, result: FrameResult) -> None:
        for sink in self._sinks:
            sink.emit(result)
