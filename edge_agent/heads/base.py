"""Result types shared by every head.

Heads are pure: they turn output tensors (numpy arrays) into these results and
know nothing about OpenVINO, files or MQTT. Results are frozen pydantic models
so they serialise straight to JSON lines and, later, to MQTT payloads.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, Protocol

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field

from edge_agent.errors import EdgeAgentError

FloatArray = npt.NDArray[np.float32]
Outputs = Mapping[str, npt.NDArray[np.generic]]


class _Result(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Detection(_Result):
    """One object found: a head gives it in model-input pixels, a pipeline in frame pixels."""

    kind: Literal["detection"] = "detection"
    label: str = Field(description="Class name from the model's manifest.")
    class_id: int = Field(description="Class index as the model numbers it.")
    score: float = Field(ge=0.0, le=1.0, description="Confidence in [0, 1].")
    box: tuple[float, float, float, float] = Field(
        description="x_min, y_min, x_max, y_max in pixels (model input from a head, frame after).",
    )
    keypoints: tuple[tuple[float, float], ...] = Field(
        default=(), description="Optional (x, y) keypoints in input pixels, e.g. face landmarks."
    )


class Classification(_Result):
    """One of the top-k classes of a frame."""

    kind: Literal["class"] = "class"
    label: str = Field(description="Class name from the model's manifest.")
    class_id: int = Field(description="Class index as the model numbers it.")
    score: float = Field(description="Probability (after softmax when the model gives logits).")


class TextBox(_Result):
    """A text region found by a DBNet-style detector, as a quadrilateral."""

    kind: Literal["text"] = "text"
    score: float = Field(ge=0.0, le=1.0, description="Mean probability inside the region.")
    polygon: tuple[tuple[float, float], ...] = Field(
        description="Four (x, y) corners in input pixels, clockwise from top-left."
    )


class SpeechSegment(_Result):
    """A span of speech in an audio stream."""

    kind: Literal["speech"] = "speech"
    start: float = Field(ge=0.0, description="Start in seconds from the start of the stream.")
    end: float = Field(ge=0.0, description="End in seconds from the start of the stream.")


class TensorSummary(_Result):
    """What the raw head reports for a model the agent does not know."""

    kind: Literal["tensor"] = "tensor"
    name: str = Field(description="Output tensor name.")
    shape: tuple[int, ...] = Field(description="Output shape.")
    dtype: str = Field(description="Element type.")
    min: float = Field(description="Smallest element.")
    max: float = Field(description="Largest element.")
    mean: float = Field(description="Mean of all elements.")
    argmax: int = Field(description="Flat index of the largest element.")


Result = Detection | Classification | TextBox | SpeechSegment | TensorSummary


class FrameHead(Protocol):
    """Decodes one model call's outputs into results in model-input pixels.

    `input_size` is the (width, height) of the model's input. A head knows nothing of
    frames: how a frame (or a tile of it) became that input, and the map back, is the
    caller's `vision.geometry.Geometry`.
    """

    def decode(self, outputs: Outputs, input_size: tuple[int, int]) -> list[Result]: ...


def pick(outputs: Outputs, name: str, key: str = "output") -> npt.NDArray[np.generic]:
    """Return output `name`, or fail naming the outputs that do exist.

    Backends key each output under every name it has (OpenVINO keeps several),
    so a head can name the role-bearing one from the manifest.

    Args:
        outputs: the model's outputs by name.
        name: the output the manifest's head names.
        key: the head's config key that named it, for the message.

    Raises:
        EdgeAgentError: `model.incompatible`, the model has no output `name`; the message
            lists the outputs it has, since the manifest is what the operator must edit.
    """
    try:
        return outputs[name]
    except KeyError:
        known = ", ".join(sorted(outputs)) or "none"
        raise EdgeAgentError(
            f"model has no output {name!r} (the manifest's [head] {key}); it has: {known}",
            f"set [head] {key} in the model's manifest to one of the outputs it has",
            code="model.incompatible",
        ) from None


def decode_checked(head: FrameHead, outputs: Outputs, input_size: tuple[int, int]) -> list[Result]:
    """`head.decode`, with a head that does not fit the model's outputs said as the
    operator's problem: the heads check the shapes they are given and raise ValueError,
    which would otherwise reach the CLI as a traceback.

    Raises:
        EdgeAgentError: `model.incompatible`, the manifest's [head] cannot read these outputs.
    """
    try:
        return head.decode(outputs, input_size)
    except ValueError as exc:
        raise EdgeAgentError(
            f"the manifest's [head] cannot read this model's outputs: {exc}",
            "set [head] in the model's manifest to a head type that fits this model's "
            "outputs (their shapes are in the message)",
            code="model.incompatible",
        ) from None
