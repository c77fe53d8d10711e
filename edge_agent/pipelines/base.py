"""What flows through a pipeline: frames and audio chunks in, frame results out.

Sources and sinks are the pipeline's I/O; each is a small interface so tests
and the agent can plug in their own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field

from edge_agent.errors import EdgeAgentError
from edge_agent.heads.base import Result


class SourceError(EdgeAgentError):
    """A source failed for good: missing, truncated, gone, or stalled past its timeout."""


@dataclass(frozen=True, slots=True)
class Frame:
    """One decoded video frame."""

    index: int
    """0-based position in the source (gaps mean frames were dropped)."""
    ts: float
    """Seconds: media time for files, time since the source opened for live sources."""
    image: npt.NDArray[np.uint8]
    """H x W x 3, BGR, as OpenCV decodes it."""
    read_s: float
    """Seconds spent reading and decoding this frame; for a realtime file also the time it
    waited to be taken, so that end-to-end latency counts from its capture."""
    source: str | None = None
    """The file the frame came from, for image folders; None for videos and live feeds."""
    scale: int = 1
    """The JPEG reduction it was decoded at (1, 2, 4, 8): its pixels times this are the
    camera's. Only above 1 when the pipeline passed the source a `min_size`."""


@dataclass(frozen=True, slots=True)
class AudioChunk:
    """One window of mono audio at the model's sample rate."""

    index: int
    """0-based window number."""
    ts: float
    """Start of the window's new samples, in seconds from the start of the stream."""
    samples: npt.NDArray[np.float32]
    """Mono samples in [-1, 1], `hop` new ones (the runner adds model context itself)."""
    read_s: float
    """Seconds spent reading this chunk."""


class FrameSource(Protocol):
    """A camera, stream, file or folder. Not thread-safe: one reader.

    A source whose `close()` may be called from another thread while `read()` blocks, and
    makes that read return None, says so with a class attribute `interruptible = True`
    (live sources: their reads wait on a thread of their own, not in a native call).
    """

    def read(self) -> Frame | None:
        """The next frame, blocking; None at the end of a finite source.

        Raises:
            SourceError: the source failed and could not be recovered.
        """
        ...

    @property
    def dropped(self) -> int:
        """Frames discarded so far because the consumer was slower than a live source."""
        ...

    def close(self) -> None:
        """Release the device or file; safe to call twice."""
        ...


class AudioSource(Protocol):
    """A WAV file or a microphone, cut into windows."""

    def read(self) -> AudioChunk | None:
        """The next window, blocking; None at the end of a file.

        Raises:
            SourceError: the source failed and could not be recovered.
        """
        ...

    def close(self) -> None:
        """Release the device or file; safe to call twice."""
        ...

    @property
    def dropped(self) -> int:
        """Windows of audio discarded so far because the consumer was slower than a live
        source (rounded up: a part of a window lost damages the window)."""
        ...


class Event(BaseModel):
    """Something that happened once: a label appeared or went, a source failed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal[
        "appeared", "gone", "source_error", "source_reconnecting", "model_swapped", "pipeline_error"
    ] = Field(
        description=(
            "What happened; pipeline_error: the stream ended for a reason other than its "
            "source (the engine refused a frame)."
        )
    )
    rule: str = Field(default="", description="Name of the rule that fired, if any.")
    label: str = Field(default="", description="Label concerned, for appeared/gone.")
    ts: float = Field(description="Stream time of the event, in seconds.")
    detail: str = Field(default="", description="Human-readable detail (error text, model).")
    code: str | None = Field(
        default=None,
        description="The error's code, for source_error, source_reconnecting "
        "and pipeline_error (edge_agent/errors.py).",
    )


@dataclass(slots=True)
class FrameResult:
    """Everything the sinks see for one frame or audio window."""

    pipeline: str
    frame: int
    """The frame's index in its source; -1 for a result that only carries events."""
    ts: float
    results: list[Result]
    events: list[Event]
    timings: dict[str, float]
    """Seconds per stage: read, preprocess, queue, infer, postprocess (sink is measured after);
    empty for results that carry only events (`frame` -1)."""
    model: str
    image: npt.NDArray[np.uint8] | None = field(default=None, repr=False)
    """The frame itself, for snapshot sinks; never serialised."""
    source: str | None = None
    """The file the frame came from (image folders); see `Frame.source`."""
    calls: int = 1
    """Model calls this frame took: 1 in mode "frame", one per tile or region otherwise
    (0 when a still scene needed none); not serialised, telemetry reports the mean."""
    scale: int = 1
    """The frame's `Frame.scale`: `image` pixels times it are the results' (the camera's)
    pixels, so whoever draws on `image` divides by it; not serialised."""
    zones: list[tuple[str, ...]] | None = None
    """Per entry of `results`, the names of the zones its box's bottom centre is in (empty
    for one outside them all, and for results without a box); None when the pipeline has
    no zones, and then left out of the JSON."""

    def to_json(self) -> dict[str, Any]:
        """The JSON-lines form: `frame`, `ts`, `source` if known, results, `zones` if the
        pipeline has zones, events (no image)."""
        line: dict[str, Any] = {
            "pipeline": self.pipeline,
            "frame": self.frame,
            "ts": round(self.ts, 6),
            "model": self.model,
            "results": [r.model_dump(mode="json") for r in self.results],
            **({} if self.zones is None else {"zones": [list(z) for z in self.zones]}),
            "events": [e.model_dump(mode="json", exclude_defaults=False) for e in self.events],
        }
        if self.source is not None:
            line["source"] = self.source
        return line


class Sink(Protocol):
    """Where results go. `emit` is called from the pipeline's own thread, in frame order."""

    def emit(self, result: FrameResult) -> None:
        """Take one frame's result; must not block for long."""
        ...

    def close(self) -> None:
        """Flush and release; safe to call twice."""
        ...
