"""The vision pipeline's bookkeeping for frames in flight: their model calls and input buffers.

A frame takes one model call (mode "frame"), one per tile, or as many as its regions
(none at all on a still scene between sweeps). Its calls run in parallel on the
engine's requests and complete in any order, on engine threads; the frame is handed to
the emitter when its last call is back.

Each call's input is fitted into a buffer from `InputBuffers`, which allocates a buffer
only when none is free and takes it back when the call completes: the hot path
allocates nothing once as many buffers exist as calls are ever in flight at once.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from edge_agent.errors import EdgeAgentError
from edge_agent.pipelines.active import ActiveModel
from edge_agent.pipelines.base import Frame
from edge_agent.runtime.base import CompiledModel, Tensors
from edge_agent.vision.geometry import Geometry

Image = npt.NDArray[np.uint8]


@dataclass(slots=True)
class InFlight:
    """One frame between its submit and its emit."""

    seq: int
    frame: Frame
    active: ActiveModel
    started: float
    """perf_counter when the frame started to be read."""
    calls: list[Geometry]
    """One geometry per model call, in submit order."""
    prepare_s: float = 0.0
    submitted: float = 0.0
    outputs: list[Tensors | None] = field(default_factory=list)
    infer_s: float = 0.0
    """Engine seconds summed over the frame's calls: what the frame cost the device."""
    error: BaseException | None = None
    """The engine's error, when one of the frame's calls failed: the frame failed."""
    _left: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.outputs = [None] * len(self.calls)
        self._left = len(self.calls)

    def call_done(self, index: int, outputs: Tensors, infer_s: float) -> bool:
        """Record call `index`'s outputs (any thread); True when it was the frame's last."""
        with self._lock:
            self.outputs[index] = outputs
            self.infer_s += infer_s
            self._left -= 1
            return self._left == 0

    def call_failed(self, error: BaseException) -> bool:
        """Record that a call raised (any thread); True when it was the frame's last."""
        with self._lock:
            if self.error is None:
                self.error = error
            self._left -= 1
            return self._left == 0


@dataclass(frozen=True, slots=True)
class Call:
    """One model call's userdata: its frame, its place among the frame's calls, its input."""

    frame: InFlight
    index: int
    buffer: Image


@dataclass(frozen=True, slots=True)
class End:
    """The reader's last word: how many frames it submitted, and what ended the stream."""

    submitted: int
    error: EdgeAgentError | None


@dataclass(frozen=True, slots=True)
class Retire:
    """`model` serves no frame after `last` (-1: it served none)."""

    last: int
    model: CompiledModel


class InputBuffers:
    """Model-input buffers (H x W x 3 uint8), reused across frames and calls; thread-safe."""

    def __init__(self) -> None:
        self._free: dict[tuple[int, int], list[Image]] = {}
        self._lock = threading.Lock()
        self.allocated = 0
        """Buffers made so far: bounded by the calls ever in flight at once."""

    def take(self, geometry: Geometry) -> Image:
        """A buffer for `geometry`'s model size: a free one, or a new one."""
        with self._lock:
            free = self._free.get(geometry.model_size)
            if free:
                return free.pop()
            self.allocated += 1
        return geometry.new_input()

    def give(self, buffer: Image) -> None:
        """Take `buffer` back once the engine has read it (its call completed)."""
        size = (buffer.shape[1], buffer.shape[0])
        with self._lock:
            self._free.setdefault(size, []).append(buffer)
