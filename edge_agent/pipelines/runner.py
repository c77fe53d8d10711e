"""Build a running pipeline from a `PipelineSpec`: the one place specs become objects.

Many pipelines can run in one process; a shared `ModelPool` gives pipelines on
the same model one compiled model. `PipelineHandle.swap_model` compiles a new
model in the background and switches between frames.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from edge_agent.catalog.manifest import AudioInput
from edge_agent.errors import EdgeAgentError
from edge_agent.pipelines.audio import AudioPipeline, vad_config
from edge_agent.pipelines.audio_sources import MicSourceSpec, WavSourceSpec, open_audio_source
from edge_agent.pipelines.base import Event, Sink
from edge_agent.pipelines.capture import capture_folder
from edge_agent.pipelines.events import EventTracker
from edge_agent.pipelines.sinks import build_sink
from edge_agent.pipelines.sources import open_source
from edge_agent.pipelines.spec import ModelRef, PipelineSpec
from edge_agent.pipelines.vision import ActiveModel, VisionPipeline
from edge_agent.runtime.base import CompiledModel, RuntimeOptions
from edge_agent.runtime.pool import ModelPool
from edge_agent.telemetry.stats import PipelineStats, PipelineTelemetry

log = logging.getLogger(__name__)


def runtime_options(ref: ModelRef, pool: ModelPool) -> RuntimeOptions:
    return RuntimeOptions(
        device=ref.device, hint=ref.hint, precision=ref.precision, cache_dir=pool.catalog.cache
    )


class PipelineHandle:
    """A built pipeline: run it, stop it, swap its model."""

    def __init__(
        self,
        spec: PipelineSpec,
        pool: ModelPool,
        extra_sinks: list[Sink] | None = None,
    ) -> None:
        self.spec = spec
        self.pool = pool
        captures = capture_folder(pool.catalog.cache, spec.id)
        sinks = [build_sink(s, captures) for s in spec.sinks] + list(extra_sinks or [])
        self.sinks = sinks
        self.telemetry = PipelineTelemetry(spec.id)
        self.telemetry.enabled = spec.telemetry
        model, resolved = pool.acquire(
            spec.model.name, spec.model.backend, runtime_options(spec.model, pool)
        )
        self.model = model
        self._held = [model]
        tracker = EventTracker(list(spec.events))
        source_spec = spec.source
        try:
            if isinstance(source_spec, WavSourceSpec | MicSourceSpec):
                if not isinstance(resolved.manifest.input, AudioInput):
                    raise EdgeAgentError(
                        f"{resolved.manifest.name} takes images, but the source is audio",
                        "use a video, camera, stream or folder source with it",
                    )
                head = vad_config(resolved.manifest)
                audio = open_audio_source(source_spec, head.sample_rate, head.window)
                self.pipeline: VisionPipeline | AudioPipeline = AudioPipeline(
                    spec.id,
                    audio,
                    model,
                    resolved.manifest,
                    sinks,
                    self.telemetry,
                    tracker,
                    spec.max_frames,
                )
            else:
                active = ActiveModel.build(model, resolved.manifest, spec.model.name)
                frames = open_source(source_spec, on_state=self._source_state)
                self.pipeline = VisionPipeline(
                    spec.id,
                    frames,
                    active,
                    sinks,
                    self.telemetry,
                    tracker,
                    spec.max_frames,
                    on_retire=self._retire,
                )
        except BaseException:
            self.close()
            raise

    def run(self) -> PipelineStats:
        return self.pipeline.run()

    def stop(self) -> None:
        self.pipeline.stop()

    def swap_model(
        self, ref: ModelRef, on_error: Callable[[EdgeAgentError], None] | None = None
    ) -> threading.Thread:
        """Compile `ref` in the background, then switch to it between two frames."""
        pipeline = self.pipeline
        if not isinstance(pipeline, VisionPipeline):
            raise EdgeAgentError("hot swap is supported on vision pipelines only")

        def _compile() -> None:
            try:
                model, resolved = self.pool.acquire(
                    ref.name, ref.backend, runtime_options(ref, self.pool)
                )
                self._held.append(model)
                pipeline.request_swap(ActiveModel.build(model, resolved.manifest, ref.name))
            except EdgeAgentError as exc:
                log.error("pipeline=%s event=swap_failed detail=%s", self.spec.id, exc)
                if on_error is not None:
                    on_error(exc)

        thread = threading.Thread(target=_compile, name=f"swap-{self.spec.id}", daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
        for model in self._held:
            self.pool.release(model)
        self._held.clear()

    def _retire(self, model: CompiledModel) -> None:
        if model in self._held:
            self._held.remove(model)
            self.pool.release(model)

    def _source_state(self, state: str, detail: str) -> None:
        # Live sources report loss from their reader thread; the pipeline hands it to the sinks.
        pipeline = getattr(self, "pipeline", None)
        if state == "reconnecting" and isinstance(pipeline, VisionPipeline):
            pipeline.notify(Event(kind="source_reconnecting", ts=0.0, detail=detail))
