"""The audio pipeline: windows from a source through a stateful VAD, in order.

A recurrent model's state links each window to the one before, so windows run
one after another (no parallel requests); at 512 samples a window the model
costs well under a millisecond, far inside the 32 ms each window lasts.
"""

from __future__ import annotations

import logging
import threading
import time

import numpy as np

from edge_agent.catalog.manifest import Manifest
from edge_agent.errors import EdgeAgentError
from edge_agent.heads.base import Result
from edge_agent.heads.vad import VadConfig, VadSegmenter
from edge_agent.pipelines.base import AudioSource, Event, FrameResult, Sink, SourceError
from edge_agent.pipelines.events import EventTracker
from edge_agent.runtime.base import CompiledModel
from edge_agent.runtime.stateful import StatefulVad
from edge_agent.telemetry.stats import PipelineStats, PipelineTelemetry

log = logging.getLogger(__name__)


def vad_config(manifest: Manifest) -> VadConfig:
    """The VAD head of an audio model, or a clear error for any other model."""
    if not isinstance(manifest.head, VadConfig):
        raise EdgeAgentError(
            f"{manifest.name} is not an audio model", "use a video or image source with it"
        )
    return manifest.head


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
        self.error: SourceError | None = None
        self._model = model
        self._config = vad_config(manifest)
        self._label = manifest.name
        self._sinks = sinks
        self._events = events
        self._max_frames = max_frames
        self._stop = threading.Event()

    def stop(self) -> None:
        """Return from `run` after the current window; thread-safe."""
        self._stop.set()

    def run(self) -> PipelineStats:
        """Process windows until the source ends, `max_frames`, `stop()` or a source error."""
        c = self._config
        segmenter = VadSegmenter(c)
        vad = StatefulVad(self._model, c)
        context = np.zeros(c.context, dtype=np.float32)
        ts = 0.0
        count = 0
        self.telemetry.reset()
        try:
            while not self._stop.is_set() and (
                self._max_frames is None or count < self._max_frames
            ):
                try:
                    chunk = self.source.read()
                except SourceError as exc:
                    self.error = exc
                    break
                if chunk is None:
                    break
                t0 = time.perf_counter()
                window = np.concatenate([context, chunk.samples])
                context = chunk.samples[-c.context :]
                t1 = time.perf_counter()
                probability = vad.step(window)
                t2 = time.perf_counter()
                results: list[Result] = list(segmenter.push(probability))
                ts = chunk.ts
                self._emit(chunk.index, ts, results, t0, t1, t2, chunk.read_s)
                count += 1
        finally:
            self.source.close()
        tail: list[Result] = list(segmenter.flush())
        if tail:
            now = time.perf_counter()
            self._emit(count, ts, tail, now, now, now, 0.0)
        if self.error is not None:
            event = Event(kind="source_error", ts=ts, detail=str(self.error))
            log.error("pipeline=%s event=source_error detail=%s", self.name, self.error)
            self._send(FrameResult(self.name, count, ts, [], [event], {}, self._label))
        return self.telemetry.snapshot()

    def _emit(
        self,
        index: int,
        ts: float,
        results: list[Result],
        t0: float,
        t1: float,
        t2: float,
        read_s: float,
    ) -> None:
        events = self._events.update(ts, results)
        t3 = time.perf_counter()
        self._send(FrameResult(self.name, index, ts, results, events, {}, self._label))
        t4 = time.perf_counter()
        t = self.telemetry
        t.record("read", read_s)
        t.record("preprocess", t1 - t0)
        t.record("queue", 0.0)
        t.record("infer", t2 - t1)
        t.record("postprocess", t3 - t2)
        t.record("sink", t4 - t3)
        t.record("end_to_end", t4 - t0 + read_s)
        t.frame_done()

    def _send(self, result: FrameResult) -> None:
        for sink in self._sinks:
            sink.emit(result)
