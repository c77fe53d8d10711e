"""Calibration recipes and reports: data, so an MQTT command can carry them."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from edge_agent.config_files import load_validated

Mode = Literal["int8", "int8-accuracy", "weights-int8", "weights-int4"]
Rung = Literal[
    "int8", "int8-scope", "int8-accuracy", "weights-int8", "weights-int4", "bf16", "f16", "fp32"
]
"""bf16 and f16 are the uncompressed model at the device's default precision."""
Precision = Literal["f32", "bf16", "f16"]
MetricChoice = Literal[
    "auto", "detection-f1", "top1-agreement", "text-mask-f1", "speech-balanced-accuracy", "cosine"
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class IgnoredScopeSpec(_Strict):
    """Layers NNCF must leave in float."""

    patterns: list[str] = Field(default_factory=list, description="Regexes on layer names.")
    names: list[str] = Field(default_factory=list, description="Exact layer names.")
    types: list[str] = Field(default_factory=list, description="OpenVINO op types.")


class Recipe(_Strict):
    """How to compress a model and what accuracy loss is acceptable."""

    mode: Mode = Field(default="int8", description="The first rung to try.")
    preset: Literal["performance", "mixed"] = Field(
        default="performance", description="NNCF preset: symmetric, or asymmetric activations."
    )
    subset_size: int | None = Field(
        default=None,
        ge=1,
        description="Calibration samples NNCF uses; None uses every one (NNCF's own default "
        "would silently cap at 300). The report gives the number actually used.",
    )
    fast_bias_correction: bool = Field(default=True, description="NNCF's faster bias correction.")
    ignored_scope: IgnoredScopeSpec | None = Field(
        default=None, description="Layers kept in float on every INT8 rung."
    )
    max_drop: float = Field(
        default=0.01, ge=0.0, le=1.0, description="Largest metric drop allowed (absolute)."
    )
    metric: MetricChoice = Field(default="auto", description="Gate metric; auto picks by head.")
    holdout: float = Field(
        default=0.3,
        gt=0.0,
        le=0.5,
        description="Fraction of samples held out for the gate, at most half (the rest "
        "calibrates). Frames are held out one in every round(1/holdout), so 0.4 holds out "
        "half; WAV files are split whole, a single recording by its last part.",
    )
    ladder: bool = Field(
        default=True, description="On a failed gate, walk down to safer rungs, ending on FP32."
    )
    max_samples: int = Field(
        default=300, ge=4, description="Frames read from image or video data, evenly spaced."
    )
    max_audio_s: float = Field(
        default=600.0,
        ge=1.0,
        description="Seconds of audio read from WAV data: recordings longer in all are "
        "sampled in 10 s stretches spread evenly across them, not cut after the first.",
    )
    accuracy_iterations: int = Field(
        default=5,
        ge=1,
        description="Cap on NNCF accuracy-control iterations: each one re-ranks every layer "
        "group (a compile each), minutes per iteration on a 2-core box.",
    )
    bench_seconds: float = Field(
        default=3.0, gt=0.0, description="Throughput measurement per variant, in seconds."
    )
    skip: list[Rung] = Field(
        default_factory=list,
        description="Rungs of the ladder not to try, say int8-accuracy, whose layer ranking "
        "compiles the model once per layer group (minutes on a 2-core box). fp32, the floor, "
        "cannot be skipped.",
    )

    @field_validator("metric", mode="before")
    @classmethod
    def _no_plain_agreement(cls, metric: object) -> object:
        if metric == "frame-agreement":
            raise ValueError(
                "frame-agreement (plain accuracy over windows) passed a VAD that never flags "
                'speech on mostly silent audio; use "speech-balanced-accuracy" or "auto"'
            )
        return metric

    @field_validator("skip")
    @classmethod
    def _floor_stays(cls, skip: list[Rung]) -> list[Rung]:
        if "fp32" in skip:
            raise ValueError("fp32 is the ladder's floor and cannot be skipped")
        return skip


def load_recipe(path: Path) -> Recipe:
    """Read a recipe TOML file.

    Raises:
        EdgeAgentError: unreadable or invalid, naming the first bad field.
    """
    return load_validated(path, Recipe, "recipe", "see calibration/*.toml for examples")


class RungResult(_Strict):
    """One rung of the ladder, tried."""

    rung: Rung = Field(description="What was tried.")
    precision: str = Field(
        description="Precision the gate ran it at on the serving device, as the device "
        "reported it; empty when no model was made."
    )
    metric_after: float = Field(description="Gate metric of the compressed model.")
    drop: float = Field(description="metric_before - metric_after.")
    passed: bool = Field(description="drop <= max_drop.")
    reason: str = Field(description="Why it passed or failed, or why it was skipped.")
    seconds: float = Field(description="Time spent on this rung.")


class CalibrationReport(_Strict):
    """Everything calibration measured; stored beside the model and in its manifest."""

    model: str = Field(description="Model name.")
    recipe: Recipe = Field(description="Recipe used.")
    mode: Rung = Field(description="The rung that won (fp32 when none passed the gate).")
    reason: str = Field(description="Why that rung won.")
    rungs: list[RungResult] = Field(description="Every rung tried, in order.")
    metric: str = Field(description="Gate metric.")
    metric_before: float = Field(description="Metric of the FP32 model (1.0 for agreement).")
    metric_after: float = Field(description="Metric of the winning model.")
    max_drop: float = Field(description="Largest drop allowed.")
    samples: int = Field(description="Calibration samples actually used by NNCF.")
    holdout_samples: int = Field(description="Samples the gate evaluated on.")
    samples_available: int = Field(description="Samples read from the data.")
    device: str = Field(description="Device the gate scored on and throughput was measured on.")
    precision: str = Field(description="Precision the winning model runs at, as gated.")
    precision_pinned: Precision | None = Field(
        description="Precision written into the manifest (f32 when only FP32 passed); "
        "None leaves the device default, which is what the gate scored."
    )
    precision_before: str = Field(description="Precision of the baseline (f32).")
    default_precision: str = Field(description="The device's default inference precision.")
    throughput_before: float = Field(description="FP32 (f32) throughput, FPS.")
    throughput_default: float = Field(description="Throughput at the default precision, FPS.")
    throughput_after: float = Field(description="Throughput of the winning model, FPS.")
    speedup: float = Field(description="throughput_after / throughput_before (f32).")
    speedup_vs_default: float = Field(description="throughput_after / throughput_default.")
    size_before: int = Field(description="FP32 IR weights, bytes.")
    size_after: int = Field(description="Winning IR weights, bytes.")
    duration_s: float = Field(description="Whole calibration, seconds.")
    versions: dict[str, str] = Field(description="openvino and nncf versions.")
