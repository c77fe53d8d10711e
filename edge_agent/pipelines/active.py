"""The model a vision pipeline runs now: compiled model, manifest, head and input spec.

A hot swap replaces one `ActiveModel` with another between two frames; each frame
in flight keeps the one it was submitted with, so it decodes with its own head.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edge_agent.catalog.manifest import ImageInput, Manifest
from edge_agent.errors import EdgeAgentError
from edge_agent.heads.base import FrameHead, decode_checked
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
        """The model with its head, checked by one run on a blank frame.

        Raises:
            EdgeAgentError: `model.incompatible`, an audio model, or a head that cannot
                decode this model's outputs (the manifest's [head] names an output the
                model lacks); whatever the model's run raises.
        """
        spec = manifest.input
        if not isinstance(spec, ImageInput):
            raise EdgeAgentError(
                f"{manifest.name} takes audio; a video source needs an image model",
                "use an audio source (a .wav file or a microphone) with it",
                code="model.incompatible",
            )
        image = spec.with_shape(model.report.model_shape)
        active = cls(model, manifest, label, build_frame_head(manifest.head), image)
        active.check()
        return active

    def check(self) -> None:
        """Decode one run on a blank frame, so that a head that cannot read this model's
        outputs fails here, once, where the pipeline starts or before a swap lands, and
        not as a warning on every frame of a pipeline that runs on and exits 0. One run
        costs the start a few milliseconds."""
        spec = self.image
        blank = np.zeros((spec.shape[0], spec.height, spec.width, 3), dtype=np.uint8)
        outputs = self.model.infer({spec.name: blank})
        decode_checked(self.head, outputs, (spec.width, spec.height))
