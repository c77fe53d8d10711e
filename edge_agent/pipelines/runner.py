"""Build a running pipeline from a `PipelineSpec`: the one place specs become objects.

Many pipelines can run in one process; a shared `ModelPool` gives pipelines on
the same model one compiled model. `PipelineHandle.swap_model` compiles a new
model in the background and switches between frames; swaps land in the order they
were asked for, whatever order their compiles finish in. Every sink is wrapped in a
`guard.GuardedSink` here, so no sink can stop or hang a pipeline, vision or audio.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from edge_agent.catalog.manifest import AudioInput
from edge_agent.errors import EdgeAgentError
from edge_agent.logs import error_text, log_event
from edge_agent.paths import Layout
from edge_agent.pipelines.active import ActiveModel
from edge_agent.pipelines.audio import AudioPipeline, vad_config
from edge_agent.pipelines.audio_sources import MicSourceSpec, WavSourceSpec, open_audio_source
from edge_agent.pipelines.base import AudioSource, Event, FrameSource, Sink
from edge_agent.pipelines.detect import Detector, check_mode
from edge_agent.pipelines.events import EventTracker
from edge_agent.pipelines.guard import GuardedSink, guard_sinks
from edge_agent.pipelines.live_sources import LiveSource
from edge_agent.pipelines.sinks import SinkSpec, build_sink, sink_name
from edge_agent.pipelines.sources import open_source
from edge_agent.pipelines.spec import ModelRef, PipelineSpec
from edge_agent.pipelines.vision import VisionPipeline
from edge_agent.runtime.base import CompiledModel, RuntimeOptions
from edge_agent.runtime.pool import ModelPool
from edge_agent.telemetry.stats import PipelineStats, PipelineTelemetry

log = logging.getLogger(__name__)


def runtime_options(ref: ModelRef, pool: ModelPool) -> RuntimeOptions:
    return RuntimeOptions(
        device=ref.device, hint=ref.hint, precision=ref.precision, cache_dir=pool.catalog.cache
    )


def _open_sink(spec: SinkSpec, captures: Path) -> Sink:
    try:
        return build_sink(spec, captures)
    except OSError as exc:
        raise EdgeAgentError(
            f"sink {sink_name(spec)} cannot be opened: {exc.strerror or exc}",
            "check that the path exists and is writable, or change the spec's sinks",
            code="sink.failed",
        ) from None


class PipelineHandle:
    """A built pipeline: run it, stop it, swap its model.

    Args:
        spec: What to build.
        pool: Where compiled models come from (and go back to).
        extra_sinks: Sinks besides the spec's (the CLI's stdout, a test's callback).
        layout: Where capture sinks keep frames (`Layout.captures(spec.id)`); by
            default the layout the environment gives, with the pool's cache.
        frames: A video source to use instead of opening `spec.source` (tests, the soak).
    """

    def __init__(
        self,
        spec: PipelineSpec,
        pool: ModelPool,
        extra_sinks: Sequence[Sink] | None = None,
        *,
        layout: Layout | None = None,
        frames: FrameSource | None = None,
        on_live: Callable[[], object] | None = None,
    ) -> None:
        self.spec = spec
        self._on_live = on_live
        """Called (on the source's reader thread) each time a live source sends frames,
        at its first frame and after each reconnect: the agent's outage record."""
        self.pool = pool
        self.layout = layout or Layout.from_env(os.environ, cache=pool.catalog.cache)
        self.telemetry = PipelineTelemetry(spec.id)
        self.telemetry.enabled = spec.telemetry
        self._lock = threading.Lock()
        self._held: list[CompiledModel] = []
        self._closed = False  # set by close(), under _lock
        # The source this handle opened, closed by close() if run() never started: a
        # pipeline's run closes its source on the way out, and one that never ran closed
        # none (a stop while the agent started it): a live camera was read for good.
        self._source: FrameSource | AudioSource | None = None
        self._ran = False  # under _lock
        # The latest swap asked for, and the lock a finished compile lands under: see
        # swap_model.
        self._swaps = 0
        self._landing = threading.Lock()
        self.ref = spec.model
        """The model the pipeline runs, or runs from its next frame: the spec's, then that
        of the latest swap to land."""
        self.sinks: list[GuardedSink] = []
        # Sinks are opened last, once the model and the source are: opening one makes its
        # file or folder, and a start refused for its model or its source must leave none.
        try:
            model, resolved = pool.acquire(
                spec.model.name, spec.model.backend, runtime_options(spec.model, pool)
            )
            self.model = model
            self._held.append(model)
            tracker = EventTracker(list(spec.events))
            source_spec = spec.source
            if isinstance(source_spec, WavSourceSpec | MicSourceSpec):
                if not isinstance(resolved.manifest.input, AudioInput):
                    raise EdgeAgentError(
                        f"{resolved.manifest.name} takes images, but the source is audio",
                        "use a video, camera, stream or folder source with it",
                        code="model.incompatible",
                    )
                head = vad_config(resolved.manifest)
                audio = self._source = open_audio_source(
                    source_spec, head.sample_rate, head.window, on_live=self._on_live
                )
                self._open_sinks(extra_sinks, audio)
                self.pipeline: VisionPipeline | AudioPipeline = AudioPipeline(
                    spec.id,
                    audio,
                    model,
                    resolved.manifest,
                    list(self.sinks),
                    self.telemetry,
                    tracker,
                    spec.max_frames,
                )
            else:
                check_mode(spec.detect.mode, resolved.manifest)
                active = ActiveModel.build(model, resolved.manifest, spec.model.name)
                detector = Detector(
                    spec.detect, spec.zones, spec.masks, self.layout.regions(spec.id)
                )
                opened = None
                if frames is None:
                    # Sized for the first model: a hot swap to a larger input keeps the
                    # decode scale (results stay in camera pixels, detail may be lost).
                    frames = opened = self._source = open_source(
                        source_spec,
                        on_state=self._source_state,
                        min_size=detector.min_size(active.image),
                        pipeline=spec.id,
                    )
                self._open_sinks(extra_sinks, opened)
                self.pipeline = VisionPipeline(
                    spec.id,
                    frames,
                    active,
                    list(self.sinks),
                    self.telemetry,
                    tracker,
                    spec.max_frames,
                    on_retire=self._retire,
                    detector=detector,
                )
        except BaseException:
            self.close()
            raise

    def _open_sinks(
        self, extra_sinks: Sequence[Sink] | None, opened: FrameSource | AudioSource | None
    ) -> None:
        """Open the spec's sinks, then guard them and the extra ones into `sinks`; `opened`
        (a source this handle opened) is closed when a sink cannot be: no pipeline owns it
        yet."""
        captures = self.layout.captures(self.spec.id)
        try:
            for sink_spec in self.spec.sinks:
                sink = _open_sink(sink_spec, captures)
                name = sink_name(sink_spec)
                self.sinks.append(GuardedSink(sink, name, self.spec.id, self._sink_failed))
        except BaseException:
            if opened is not None:
                opened.close()
            raise
        extra = list(extra_sinks or [])
        names = [f"{type(s).__name__}#{i}" for i, s in enumerate(extra)]
        self.sinks += guard_sinks(extra, self.spec.id, self._sink_failed, names)

    def run(self) -> PipelineStats:
        """Run until the source ends or `stop()`; the summary of the run."""
        with self._lock:
            self._ran = True
        return self.pipeline.run()

    def stop(self) -> None:
        """End `run()` within 2 s; safe from any thread and from a signal handler."""
        self.pipeline.stop()

    def swap_model(
        self, ref: ModelRef, on_error: Callable[[EdgeAgentError], None] | None = None
    ) -> threading.Thread:
        """Compile `ref` in the background, then switch to it between two frames.

        The latest swap asked for wins: a compile that finishes after a later swap was
        asked for gives its model back and is dropped, and its failure is logged but
        not passed to `on_error` (the later swap decides what runs). Compiles finish
        in any order (a first compile on a GPU takes a minute, one from the compile
        cache a second), and landing in that order ran a model no one had asked for
        last: a deploy's v2 landing over the rollback to v1 sent after it.

        Args:
            ref: The model to run next.
            on_error: Called, on the swap's thread, when the swap fails and no later
                one was asked for; a failure that is not an EdgeAgentError (a bug)
                arrives as one with code "internal".
        """
        pipeline = self.pipeline
        if not isinstance(pipeline, VisionPipeline):
            raise EdgeAgentError(
                "hot swap is supported on vision pipelines only",
                "stop the audio pipeline and start it with the new model",
                code="model.incompatible",
            )
        with self._landing:
            self._swaps += 1
            swap = self._swaps

        def _compile() -> None:
            try:
                model, resolved = self.pool.acquire(
                    ref.name, ref.backend, runtime_options(ref, self.pool)
                )
                try:
                    check_mode(self.spec.detect.mode, resolved.manifest)
                    active = ActiveModel.build(model, resolved.manifest, ref.name)
                except BaseException:
                    self.pool.release(model)
                    raise
                # The check and the request under one lock: a later swap lands after
                # this one, or finds itself the latest and this one dropped.
                with self._landing:
                    with self._lock:
                        dropped = (
                            "superseded"
                            if swap != self._swaps
                            else "pipeline ended"
                            if self._closed
                            else None
                        )
                        if dropped is None:
                            self._held.append(model)
                    if dropped is None:
                        pipeline.request_swap(active)
                        self.ref = ref
                        return
                # Superseded, or the pipeline ended while this compiled (a stop, a camera
                # given up, a file played out): nothing would ever give this model back,
                # and the pool would keep it compiled, and listed as loaded, for good.
                self.pool.release(model)
                log_event(
                    log,
                    logging.INFO,
                    "swap_dropped",
                    pipeline=self.spec.id,
                    model=ref.name,
                    reason=dropped,
                )
            except Exception as exc:
                error = (
                    exc
                    if isinstance(exc, EdgeAgentError)
                    else EdgeAgentError(
                        f"model swap to {ref.name} failed: {error_text(exc)}",
                        "see the agent's log for the traceback",
                        code="internal",
                    )
                )
                log_event(
                    log,
                    logging.ERROR,
                    "swap_failed",
                    pipeline=self.spec.id,
                    model=ref.name,
                    code=error.code,
                    error=str(error),
                )
                if error is not exc:
                    # A bug keeps its traceback, for whoever asked for debug output.
                    log.debug("swap_traceback", exc_info=exc)
                with self._landing:
                    superseded = swap != self._swaps
                if on_error is not None and not superseded:
                    on_error(error)

        thread = threading.Thread(target=_compile, name=f"swap-{self.spec.id}", daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        """Close the sinks (their errors are counted) and give the models back to the pool."""
        for sink in self.sinks:
            sink.close()
        with self._lock:
            held, self._held = self._held, []
            self._closed = True  # a swap still compiling gives its model back itself
            unread = None if self._ran else self._source
            self._ran = True  # a run() after close() reads a closed source, which ends it
        if unread is not None:
            unread.close()
        for model in held:
            self.pool.release(model)

    def _sink_failed(self) -> None:
        self.telemetry.count("sink_failures")

    def _retire(self, model: CompiledModel) -> None:
        # Called by the pipeline once the model's last frame is out.
        with self._lock:
            if model not in self._held:
                return
            self._held.remove(model)
        self.pool.release(model)

    def _source_state(self, state: str, detail: str) -> None:
        # Live sources report loss from their reader thread; the pipeline hands it to the sinks.
        pipeline = getattr(self, "pipeline", None)
        if state == "reconnecting" and isinstance(pipeline, VisionPipeline):
            source = pipeline.source
            code = source.loss_code if isinstance(source, LiveSource) else None
            pipeline.notify(Event(kind="source_reconnecting", ts=0.0, detail=detail, code=code))
        elif state == "live" and self._on_live is not None:
            # The source's own word that frames flow: frames still coming out of the engine
            # after a loss were read before it, and say nothing of the source's return.
            self._on_live()
