"""`PipelineSpec`: a pipeline described as data (TOML or JSON).

The agent will start, stop and reconfigure pipelines from MQTT commands
carrying this same model, so it holds no paths to code, only data.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from edge_agent.config_files import load_validated
from edge_agent.pipelines.audio_sources import MicSourceSpec, WavSourceSpec
from edge_agent.pipelines.events import EventRule
from edge_agent.pipelines.sinks import JsonLinesSinkSpec, SinkSpec
from edge_agent.pipelines.sources import (
    CameraSourceSpec,
    FileSourceSpec,
    FolderSourceSpec,
    StreamSourceSpec,
)
from edge_agent.runtime.base import Hint, Precision

AnySourceSpec = Annotated[
    FileSourceSpec
    | FolderSourceSpec
    | CameraSourceSpec
    | StreamSourceSpec
    | WavSourceSpec
    | MicSourceSpec,
    Field(discriminator="type"),
]


class ModelRef(BaseModel):
    """Which model, on which engine and device."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(
        description="Reference model name, or a model file with a manifest beside it."
    )
    backend: str = Field(
        default="openvino", pattern="^(openvino|onnxruntime)$", description="Engine."
    )
    device: str = Field(default="CPU", description="CPU, GPU, NPU, AUTO or a priority list.")
    hint: Hint = Field(default="throughput", description="OpenVINO performance hint.")
    precision: Precision | None = Field(default=None, description="None keeps the device default.")


def _stdout_sink() -> list[SinkSpec]:
    return [JsonLinesSinkSpec()]


class PipelineSpec(BaseModel):
    """A whole pipeline: source, model, event rules, sinks."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$", description="Unique within the agent.")
    model: ModelRef = Field(description="The model to run.")
    source: AnySourceSpec = Field(description="Where frames or audio come from.")
    events: list[EventRule] = Field(default_factory=list, description="Event rules.")
    sinks: list[SinkSpec] = Field(default_factory=_stdout_sink, description="Where results go.")
    max_frames: int | None = Field(default=None, ge=1, description="Stop after this many frames.")
    telemetry: bool = Field(default=True, description="Keep per-stage latency histograms.")


def load_spec(path: Path) -> PipelineSpec:
    """Read a pipeline spec from .toml or .json.

    Raises:
        EdgeAgentError: unreadable file or invalid spec, naming the first bad field.
    """
    return load_validated(path, PipelineSpec, "pipeline spec", "see the spec format in the README")
