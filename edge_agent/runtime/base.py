"""The backend interface every inference engine implements.

A backend compiles a model file for a device and hands back a `CompiledModel`
that callers feed with raw inputs: for image models a uint8 BGR frame of any
size (resizing, colour order, normalisation and layout are the backend's job,
folded into the graph where the engine can). Every compile says which device
it really runs on and why any other was passed over.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Literal, Protocol, Self

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field

from edge_agent.catalog.manifest import Manifest

Tensor = npt.NDArray[np.generic]
Tensors = dict[str, Tensor]
Hint = Literal["latency", "throughput"]
Precision = Literal["f32", "bf16", "f16"]
Done = Callable[[Tensors, object, float], None]
"""Called from an engine thread with a request's outputs, the caller's userdata, and the
seconds the engine spent on it (from start to completion, excluding time queued for a
free request)."""
Failed = Callable[[BaseException, object], None]
"""Called from an engine thread when a submitted run raised, with the error and the
caller's userdata, in place of `Done`."""


class RuntimeOptions(BaseModel):
    """How to compile: device, hint, precision, caching."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    device: str = Field(
        default="CPU",
        description="CPU, GPU, NPU, AUTO, or a priority list such as GPU,CPU (tried in order).",
    )
    hint: Hint = Field(default="latency", description="OpenVINO performance hint.")
    precision: Precision | None = Field(
        default=None,
        description="Inference precision; None keeps the device default (bf16 on CPUs with it).",
    )
    cache_dir: Path | None = Field(
        default=None, description="Folder for prepared models and compiled blobs; None disables."
    )
    shape: tuple[int, ...] | None = Field(
        default=None, description="Input shape override, in the model's own layout."
    )
    requests: int | None = Field(
        default=None, ge=1, description="Parallel infer requests; None asks the device."
    )


class Fallback(BaseModel):
    """A device that was asked for and not used, and why."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    device: str = Field(description="The device passed over.")
    reason: str = Field(description="Why it was passed over.")


class CompileReport(BaseModel):
    """What a compile produced: reported with every result and benchmark."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: Literal["openvino", "onnxruntime"] = Field(description="Engine.")
    requested: str = Field(description="Device string as asked.")
    device: str = Field(description="Device(s) actually executing, as the engine reports them.")
    fallbacks: tuple[Fallback, ...] = Field(default=(), description="Devices passed over.")
    precision: str = Field(
        description=(
            "Inference precision really used, as the device reports it after compile; "
            "'CPU:bf16,GPU:f16' when devices under AUTO/MULTI/HETERO differ."
        )
    )
    precision_requested: Precision | None = Field(
        default=None,
        description=(
            "Precision asked for: the option, else the manifest's pin; "
            "None kept the device default."
        ),
    )
    precision_note: str = Field(
        default="",
        description="Why the precision used differs from the one requested; empty when honoured.",
    )
    hint: Hint = Field(description="Performance hint used.")
    requests: int = Field(description="Parallel infer requests the model runs with.")
    compile_s: float = Field(description="Seconds from file to ready model, preparation included.")
    from_cache: bool = Field(description="The compiled blob came from the model cache.")
    model_shape: tuple[int, ...] | None = Field(
        default=None,
        description="An image model's own input shape, behind the folded preprocessing.",
    )
    inputs: dict[str, tuple[int, ...]] = Field(
        description="Each input's shape as fed: a frame input as N,H,W,3 uint8 at the model's size."
    )


class CompiledModel(Protocol):
    """A model ready to run, safe to share: `infer`, `submit` and `wait` may be called from
    any thread at once (the pool hands one model to several pipelines).

    Use it as a context manager, or call `close` when done, as httpx's transports are:
    a service that swaps models for months must give the engine's memory back.
    """

    report: CompileReport

    def infer(self, inputs: Mapping[str, Tensor]) -> Tensors:
        """Run synchronously; outputs are keyed by every name each output has."""
        ...

    def submit(
        self,
        inputs: Mapping[str, Tensor],
        done: Done,
        userdata: object,
        failed: Failed | None = None,
    ) -> None:
        """Queue an asynchronous run; blocks only while every request is busy.

        A run that raises calls `failed`, when given; without it the error waits for the
        next `wait`."""
        ...

    def wait(self) -> None:
        """Block until every submitted run has called its `done`.

        Raises:
            EdgeAgentError: a submitted run failed (code inference.failed).
        """
        ...

    def close(self) -> None:
        """Wait for runs in flight, then free the engine's requests and memory.

        Idempotent. Afterwards `infer` and `submit` raise EdgeAgentError (inference.failed).
        Called from inside a `done`, it returns at once and finishes in the background.
        """
        ...

    def __enter__(self) -> Self: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


class Backend(Protocol):
    """An inference engine."""

    @property
    def name(self) -> str:
        """Engine name, as --backend takes it."""
        ...

    def compile(self, path: Path, manifest: Manifest, options: RuntimeOptions) -> CompiledModel:
        """Compile `path` as `manifest` describes, on the best device `options` allows."""
        ...
