"""`PipelineSpec`: a pipeline described as data (TOML or JSON).

The agent will start, stop and reconfigure pipelines from MQTT commands
carrying this same model, so it holds no paths to code, only data.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from edge_agent.config_files import is_recorded, load_validated
from edge_agent.pipelines.audio_sources import MicSourceSpec, WavSourceSpec
from edge_agent.pipelines.capture import CaptureSinkSpec
from edge_agent.pipelines.events import EventRule
from edge_agent.pipelines.sinks import JsonLinesSinkSpec, SinkSpec
from edge_agent.pipelines.sources import (
    CameraSourceSpec,
    FileSourceSpec,
    FolderSourceSpec,
    StreamSourceSpec,
)
from edge_agent.runtime.base import Hint, Precision
from edge_agent.vision.zones import Mask, Zone

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
        description="Reference or store model name, or (local CLI only; the agent refuses "
        "paths) a model file with a manifest beside it."
    )
    backend: str = Field(
        default="openvino", pattern="^(openvino|onnxruntime)$", description="Engine."
    )
    device: str = Field(default="CPU", description="CPU, GPU, NPU, AUTO or a priority list.")
    hint: Hint = Field(default="throughput", description="OpenVINO performance hint.")
    precision: Precision | None = Field(default=None, description="None keeps the device default.")


class DetectSpec(BaseModel):
    """Where in each frame the model looks (the README's spec section gives the costs)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Literal["frame", "tiles", "regions"] = Field(
        default="frame",
        description=(
            "frame: one call on the whole frame, aspect-true as the manifest's fit says; "
            "tiles: overlapping squares over the frame (or its zones), one call each; "
            "regions: only where there is motion or a tracked object, plus periodic sweeps."
        ),
    )
    tile: int | None = Field(
        default=None,
        ge=32,
        description="Tile side in frame pixels (tiles, and regions' sweeps); "
        "default half the frame height, never under the model's input.",
    )
    overlap: float = Field(
        default=0.2, ge=0.0, lt=0.9, description="Fraction of a tile shared with its neighbour."
    )
    sweep_every_s: float = Field(
        default=5.0,
        ge=0.0,
        description="regions: stream seconds between full tiled sweeps (0: every frame).",
    )
    learn: bool = Field(
        default=True,
        description="regions: learn object sizes per cell of an 8x8 grid, kept in the state "
        "directory, to size regions around partial motion.",
    )


def _stdout_sink() -> list[SinkSpec]:
    return [JsonLinesSinkSpec()]


class PipelineSpec(BaseModel):
    """A whole pipeline: source, model, event rules, sinks."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$", description="Unique within the agent.")
    model: ModelRef = Field(description="The model to run.")
    source: AnySourceSpec = Field(description="Where frames or audio come from.")
    detect: DetectSpec = Field(
        default_factory=DetectSpec, description="Where in each frame the model looks."
    )
    zones: list[Zone] = Field(
        default_factory=list, description="Named areas; event rules and results name them."
    )
    masks: list[Mask] = Field(
        default_factory=list, description="Areas whose detections and motion are ignored."
    )
    events: list[EventRule] = Field(default_factory=list, description="Event rules.")
    sinks: list[SinkSpec] = Field(default_factory=_stdout_sink, description="Where results go.")
    max_frames: int | None = Field(default=None, ge=1, description="Stop after this many frames.")
    telemetry: bool = Field(default=True, description="Keep per-stage latency histograms.")

    @field_validator("id")
    @classmethod
    def _not_a_folder_step(cls, value: str) -> str:
        # The id names its captures' folder (`Layout.captures`): `..` wrote a capture
        # sink's frames into the state folder's root, beside the agent's record.
        if value in (".", ".."):
            raise ValueError(f"{value!r} is not a pipeline id: use letters or digits too")
        return value

    @model_validator(mode="after")
    def _zones_named(self) -> PipelineSpec:
        names = [z.name for z in self.zones]
        if len(set(names)) != len(names):
            raise ValueError(f"zone names must be unique; got {names}")
        for rule in self.events:
            if rule.zone is not None and rule.zone not in names:
                known = ", ".join(names) or "none"
                raise ValueError(
                    f"event rule {rule.name!r} names zone {rule.zone!r}; the zones are: {known}"
                )
        return self

    @model_validator(mode="before")
    @classmethod
    def _recorded_audio_capture(cls, data: Any, info: ValidationInfo) -> Any:
        # From the record of a build that accepted it (`_capture_has_frames`): it never
        # kept a frame, and refused, it kept the whole audio pipeline from coming back
        # after the upgrade. Dropped there; a new spec with one is still refused.
        if not is_recorded(info) or not isinstance(data, dict):
            return data
        source, sinks = data.get("source"), data.get("sinks")
        audio = isinstance(source, dict) and source.get("type") in ("wav", "mic")
        if not audio or not isinstance(sinks, list):
            return data
        kept = [s for s in sinks if not (isinstance(s, dict) and s.get("type") == "capture")]
        return {**data, "sinks": kept}

    @model_validator(mode="after")
    def _capture_has_frames(self) -> PipelineSpec:
        # An audio pipeline's capture sink was accepted and wrote nothing, and calibrate
        # --data pipeline:<id> then said to add the capture sink the spec already had.
        audio = isinstance(self.source, WavSourceSpec | MicSourceSpec)
        if audio and any(isinstance(s, CaptureSinkSpec) for s in self.sinks):
            raise ValueError(
                "a capture sink keeps video frames and an audio source has none; remove it "
                "and calibrate an audio model on WAV files (calibrate --data <folder of WAVs>)"
            )
        return self


def load_spec(path: Path) -> PipelineSpec:
    """Read a pipeline spec from .toml or .json.

    Raises:
        EdgeAgentError: unreadable file or invalid spec, naming the first bad field.
    """
    return load_validated(path, PipelineSpec, "pipeline spec", "see the spec format in the README")
