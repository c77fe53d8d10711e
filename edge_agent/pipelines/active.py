"""The model a vision pipeline runs now: compiled model, manifest, head and input spec.

A hot swap replaces one `ActiveModel` with another between two frames; each frame
in flight keeps the one it was submitted with, so it decodes with its own head.
"""

from __future__ import annotations

from dataclasses import dataclass

from edge_agent.catalog.manifest import ImageInput, Manifest
from edge_agent.errors import EdgeAgentError
from edge_agent.heads.base import FrameHead
from edge_agent.heads.registry import build_frame_head
from edge_agent.runtime.base import CompiledModel


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
                code="model.incompatible",
            )
        image = spec.with_shape(model.report.model_shape)
        return cls(model, manifest, label, build_frame_head(manifest.head), image)
