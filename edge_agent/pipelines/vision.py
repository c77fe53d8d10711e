"""The vision pipeline: read frames, keep every infer request busy, emit in order.

Three threads share the work so none waits on another more than it must:
- the caller's thread reads frames and submits them (blocking only while every
  infer request is busy: that wait is the "queue" stage);
- the engine's threads run inference and hand outputs back;
- an emitter thread puts results back in frame order, decodes them, applies
  event rules and feeds the sinks.
A semaphore bounds frames in flight, so a slow sink slows reading (a file) or
makes a live source drop its oldest frames, instead of growing memory.

A model swap is applied between two submits: frames already in flight finish
on the old model and decode with its head, the next frame goes to the new one.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from edge_agent.catalog.manifest import ImageInput, Manifest
from edge_agent.errors import EdgeAgentError
from edge_agent.heads.base import FrameHead
from edge_agent.heads.registry import build_frame_head
from edge_agent.pipelines.base import Event, Frame, FrameResult, FrameSource, Sink, SourceError
from edge_agent.pipelines.events import EventTracker
from edge_agent.runtime.base import CompiledModel, Tensors
from edge_agent.runtime.preprocess import fit_frame
from edge_agent.telemetry.stats import PipelineStats, PipelineTelemetry

log = logging.getLogger(__name__)

Retire = Callable[[CompiledModel], None]
"""Called, off the hot path, with a model that no frame will use again."""


@dataclass(frozen=True, slots=True)
class ActiveModel:
    """A compiled model with what decoding its outputs needs."""

    model: CompiledModel
    manifest: Manifest
    label: str
    head: FrameHead
    image: ImageInput
    """The input spec at the compiled model's shape: what frames are fitted to."""

    @classmethod
    def build(cls, model: CompiledModel, manifest: Manifest, label: str) -> ActiveModel:
        spec = manifest.input
        if not isinstance(spec, ImageInput):
            raise EdgeAgentError(
                f"{manifest.name} takes audio; a video source needs an image model",
                "use an audio source (a .wav file or a microphone) with it",
            )
        image = spec.with_shape(model.report.model_shape)
        return cls(model, manifest, label, build_frame_head(manifest.head), image)


@dataclass(slots=True)
class _InFlight:
    seq: int
    frame: Frame
    active: ActiveModel
    started: float
    prepare_s: float
    submitted: float


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
        on_retire: Retire | None = None,
    ) -> None:
        self.name = name
        self.source = source
        self.telemetry = telemetry
        self.error: SourceError | None = None
        self.failures = 0
        self._last_ts = 0.0
        self._active = active
        self._sinks = sinks
        self._events = events
        self._max_frames = max_frames
        self._on_retire = on_retire
        self._pending: ActiveModel | None = None
        self._swap_lock = threading.Lock()
        self._stop = threading.Event()
        self._done: queue.SimpleQueue[tuple[_InFlight, Tensors, float, float] | Event | None] = (
            queue.SimpleQueue()
        )
        self._window = threading.BoundedSemaphore(max(2, 2 * active.model.report.requests + 2))
        self._swapped: list[Event] = []

    def request_swap(self, active: ActiveModel) -> None:
        """Run `active` from the next frame on; thread-safe, returns at once."""
        with self._swap_lock:
            self._pending = active

    def notify(self, event: Event) -> None:
        """Send `event` to the sinks now, between frames; thread-safe (sources call it)."""
        self._done.put(event.model_copy(update={"ts": self._last_ts}))

    def stop(self) -> None:
        """Finish the frames in flight and return from `run`; thread-safe."""
        self._stop.set()

    def run(self) -> PipelineStats:
        """Process frames until the source ends, `max_frames`, `stop()` or a source error."""
        # FPS counts from the first frame, not from when the model was compiled.
        self.telemetry.reset()
        emitter = threading.Thread(target=self._emit_loop, name=f"emit-{self.name}", daemon=True)
        emitter.start()
        used = [self._active]
        seq = 0
        try:
            while not self._stop.is_set() and (self._max_frames is None or seq < self._max_frames):
                swapped = self._take_swap()
                if swapped is not None:
                    used.append(swapped)
                try:
                    frame = self.source.read()
                except SourceError as exc:
                    self.error = exc
                    break
                if frame is None:
                    break
                self._submit(seq, frame)
                seq += 1
        finally:
            for active in used:
                active.model.wait()
            self._done.put(None)
            emitter.join()
            self.telemetry.set_dropped(self.source.dropped)
            self.source.close()
        if self.error is not None:
            self._emit_error(self.error, seq)
        for active in used[:-1]:
            if self._on_retire is not None:
                self._on_retire(active.model)
        return self.telemetry.snapshot()

    def _take_swap(self) -> ActiveModel | None:
        with self._swap_lock:
            pending, self._pending = self._pending, None
        if pending is None:
            return None
        old, self._active = self._active, pending
        self._swapped.append(
            Event(kind="model_swapped", ts=0.0, detail=f"{old.label} -> {pending.label}")
        )
        log.info(
            "pipeline=%s event=model_swapped from=%s to=%s", self.name, old.label, pending.label
        )
        return pending

    def _submit(self, seq: int, frame: Frame) -> None:
        active = self._active
        self._last_ts = frame.ts
        started = time.perf_counter() - frame.read_s
        self._window.acquire()
        t0 = time.perf_counter()
        # Fitting here (not inside submit) makes it the "preprocess" stage; the backend
        # then finds the frame already at the model's size and does not copy it again.
        inputs = {active.image.name: fit_frame(frame.image, active.image)[None]}
        prepared = time.perf_counter()
        item = _InFlight(seq, frame, active, started, prepared - t0, prepared)
        active.model.submit(inputs, self._completed, item)

    def _completed(self, outputs: Tensors, userdata: object, infer_s: float) -> None:
        # Engine thread: hand over and return at once, the emitter does the rest.
        assert isinstance(userdata, _InFlight)
        self._done.put((userdata, outputs, infer_s, time.perf_counter()))

    def _emit_loop(self) -> None:
        waiting: dict[int, tuple[_InFlight, Tensors, float, float]] = {}
        expected = 0
        while True:
            item = self._done.get()
            if item is None:
                break
            if isinstance(item, Event):
                # The emitter is the sinks' only caller, so they need no locks of their own.
                self._send(FrameResult(self.name, -1, item.ts, [], [item], {}, self._active.label))
                continue
            waiting[item[0].seq] = item
            while expected in waiting:
                self._emit_safely(waiting.pop(expected))
                expected += 1
                self._window.release()
        # Anything left is out of order only if a frame never completed: emit what we have.
        for key in sorted(waiting):
            self._emit_safely(waiting.pop(key))

    def _emit_safely(self, item: tuple[_InFlight, Tensors, float, float]) -> None:
        # A head or sink that fails on one frame must not stop the pipeline (or hang
        # the reader waiting for a free slot): log it, count it, go on.
        try:
            self._emit(*item)
        except Exception:
            self.failures += 1
            log.exception("pipeline=%s event=emit_failed frame=%d", self.name, item[0].frame.index)

    def _emit(self, item: _InFlight, outputs: Tensors, infer_s: float, finished: float) -> None:
        t0 = time.perf_counter()
        frame = item.frame
        height, width = frame.image.shape[:2]
        results = item.active.head.decode(outputs, (width, height))
        events = self._events.update(frame.ts, results)
        if self._swapped:
            events = [e.model_copy(update={"ts": frame.ts}) for e in self._swapped] + events
            self._swapped.clear()
        decoded = time.perf_counter()
        result = FrameResult(
            pipeline=self.name,
            frame=frame.index,
            ts=frame.ts,
            results=list(results),
            events=events,
            timings={},
            model=item.active.label,
            image=frame.image,
        )
        self._send(result)
        done = time.perf_counter()
        t = self.telemetry
        t.record("read", frame.read_s)
        t.record("preprocess", item.prepare_s)
        t.record("queue", max(0.0, finished - item.submitted - infer_s))
        t.record("infer", infer_s)
        t.record("postprocess", decoded - t0)
        t.record("sink", done - decoded)
        t.record("end_to_end", done - item.started)
        t.frame_done()

    def _emit_error(self, error: SourceError, frames: int) -> None:
        event = Event(kind="source_error", ts=self._last_ts, detail=str(error))
        log.error("pipeline=%s event=source_error detail=%s", self.name, error)
        result = FrameResult(
            pipeline=self.name,
            frame=frames,
            ts=self._last_ts,
            results=[],
            events=[event],
            timings={},
            model=self._active.label,
        )
        self._send(result)

    def _send(self, result: FrameResult) -> None:
        for sink in self._sinks:
            sink.emit(result)
