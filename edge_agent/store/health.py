"""The health gate: a new model version proves itself on this box before it serves.

A version passes when it
- compiled on the planned device (one of them, for a priority list), with no
  unplanned fallback;
- ran a smoke inference (a flat grey frame, or silence) whose outputs are all
  finite and decode through the model's own head (the head is the declaration of
  which outputs exist and what shapes they have);
- met the release's latency budget, if it has one (median of a few runs).

The check runs in a child process with a deadline. A model that hangs the
compiler, or crashes the engine outright (garbage bytes can), costs a child,
never the agent, and a stuck deployment is killed rather than blocking the next.
"""

from __future__ import annotations

import logging
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field

from edge_agent.catalog.manifest import AudioInput, ImageInput, Manifest
from edge_agent.errors import EdgeAgentError
from edge_agent.heads.registry import build_frame_head
from edge_agent.heads.vad import VadConfig
from edge_agent.logs import log_event
from edge_agent.runtime.base import CompiledModel, RuntimeOptions, Tensor
from edge_agent.store.release import Release

log = logging.getLogger(__name__)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ProbeRequest(_Strict):
    """What the child process checks."""

    model: Path = Field(description="The model file, inside its store version folder.")
    manifest: Manifest = Field(description="How to feed and decode it.")
    options: RuntimeOptions = Field(description="How the agent will compile it.")
    backend: str = Field(description="Engine: openvino or onnxruntime.")
    planned_device: str | None = Field(
        description="Device it must run on, or a priority list (GPU,CPU) of devices it may run "
        "on; None means whatever `options` asks, with no fallback."
    )
    any_device: bool = Field(
        default=False,
        description="Any device it compiles on will do, fallbacks included (the agent's "
        "gate, when no version serves the pipelines to compare with).",
    )
    latency_budget_ms: float | None = Field(description="Median smoke latency cap, if any.")
    runs: int = Field(ge=1, description="Timed smoke runs after the first.")


class HealthReport(_Strict):
    """What the gate found; `reason` says why it failed."""

    ok: bool = Field(description="The version may serve.")
    reason: str = Field(default="", description="Why not, for the operator; empty when ok.")
    device: str = Field(default="", description="Device(s) the model compiled on.")
    latency_ms: float | None = Field(default=None, description="Median smoke latency.")


class HealthGateError(EdgeAgentError):
    """health.failed, with the release that failed: a deploy of `latest` knows its version
    only once it is resolved, and the model_health_failed event must name it."""

    def __init__(self, problem: str, fix: str, name: str, version: int) -> None:
        super().__init__(problem, fix, "health.failed")
        self.name = name
        self.version = version


@dataclass(frozen=True, slots=True)
class HealthGate:
    """The `Gate` the store calls before a version becomes current."""

    options: RuntimeOptions
    backend: str = "openvino"
    planned_device: str | None = None
    any_device: bool = False
    timeout_s: float = 300.0
    runs: int = 5

    def __call__(self, model: Path, release: Release) -> HealthReport:
        """Check `model` in a child process.

        Raises:
            HealthGateError: health.failed, with the reason and the release.
        """
        request = ProbeRequest(
            model=model,
            manifest=release.manifest,
            options=self.options,
            backend=self.backend,
            planned_device=self.planned_device,
            any_device=self.any_device,
            latency_budget_ms=release.latency_budget_ms,
            runs=self.runs,
        )
        report = _run_child(request, self.timeout_s)
        what = f"{release.name} v{release.version}"
        if not report.ok:
            # Said once, by whoever asked: the agent answers the command (and logs
            # command_failed) and publishes model_health_failed; the CLI prints its one
            # error line. A warning here too was a second line before the CLI's.
            # The engine and device are named: the agent gates on each its pipelines use.
            raise HealthGateError(
                f"{what} failed the health gate on {self.backend} {self.options.device}: "
                f"{report.reason}",
                "the previous version keeps serving; publish a fixed version",
                release.name,
                release.version,
            )
        log_event(
            log,
            logging.INFO,
            "model_health_passed",
            model=release.name,
            version=release.version,
            backend=self.backend,
            device=report.device,
            latency_ms=report.latency_ms,
        )
        return report


@dataclass(frozen=True, slots=True)
class HealthGates:
    """Several gates a version must all pass, in order: one per engine and device it will
    run on. The first failure stops the rest (its error names the engine and device)."""

    gates: tuple[HealthGate, ...]

    def __call__(self, model: Path, release: Release) -> list[HealthReport]:
        """Check `model` with each gate in turn.

        Raises:
            HealthGateError: health.failed, from the first gate the version fails.
        """
        return [gate(model, release) for gate in self.gates]


def _run_child(request: ProbeRequest, timeout_s: float) -> HealthReport:
    with tempfile.TemporaryDirectory(prefix="edge-agent-health-") as tmp:
        out = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "edge_agent.store.probe", str(out)]
        try:
            proc = subprocess.run(
                cmd,
                input=request.model_dump_json().encode(),
                capture_output=True,
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return HealthReport(ok=False, reason=f"no verdict within {timeout_s:.0f} s (killed)")
        if out.is_file():
            return HealthReport.model_validate_json(out.read_bytes())
        tail = (proc.stderr.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
        return HealthReport(
            ok=False, reason=f"the check process died (exit {proc.returncode}): {tail}"
        )


def check(request: ProbeRequest) -> HealthReport:
    """The checks themselves, run in the child (and callable directly in tests)."""
    from edge_agent.runtime import create_backend

    try:
        compiled = create_backend(request.backend).compile(
            request.model, request.manifest, request.options
        )
    except Exception as exc:
        return HealthReport(ok=False, reason=f"does not compile: {_first_line(exc)}")
    with compiled:
        return _check_compiled(compiled, request)


def _check_compiled(compiled: CompiledModel, request: ProbeRequest) -> HealthReport:
    report = compiled.report
    device = report.device
    # A plan of several devices (those the serving version runs on) is met by any of them.
    planned = request.planned_device
    if planned is not None and not set(planned.split(",")) & set(device.split(",")):
        return HealthReport(
            ok=False, device=device, reason=f"runs on {device}, planned {request.planned_device}"
        )
    if request.planned_device is None and not request.any_device and report.fallbacks:
        passed = "; ".join(f"{f.device}: {f.reason}" for f in report.fallbacks)
        return HealthReport(ok=False, device=device, reason=f"fell back to {device} ({passed})")
    inputs = smoke_inputs(request.manifest, report.inputs)
    timings: list[float] = []
    for _ in range(request.runs + 1):  # the first run warms up and is not timed
        started = time.perf_counter()
        try:
            outputs = compiled.infer(inputs)
        except Exception as exc:
            return HealthReport(ok=False, device=device, reason=f"inference: {_first_line(exc)}")
        timings.append((time.perf_counter() - started) * 1000.0)
        problem = output_problem(request.manifest, outputs, inputs)
        if problem:
            return HealthReport(ok=False, device=device, reason=problem)
    latency = statistics.median(timings[1:])
    budget = request.latency_budget_ms
    if budget is not None and latency > budget:
        return HealthReport(
            ok=False,
            device=device,
            latency_ms=latency,
            reason=f"median latency {latency:.1f} ms is over the budget of {budget:.1f} ms",
        )
    return HealthReport(ok=True, device=device, latency_ms=latency)


def smoke_inputs(manifest: Manifest, shapes: dict[str, tuple[int, ...]]) -> dict[str, Tensor]:
    """A flat grey frame for an image model; silence (and a zero state) for audio."""
    spec = manifest.input
    if isinstance(spec, ImageInput):
        return {spec.name: np.full((1, spec.height, spec.width, 3), 128, dtype=np.uint8)}
    assert isinstance(spec, AudioInput)
    head = manifest.head
    if isinstance(head, VadConfig):
        state = tuple(max(d, 1) for d in shapes[head.state_in])
        return {
            head.audio_input: np.zeros((1, head.window + head.context), dtype=np.float32),
            head.state_in: np.zeros(state, dtype=np.float32),
        }
    return {spec.name: np.zeros((1, spec.sample_rate), dtype=np.float32)}


def output_problem(
    manifest: Manifest, outputs: dict[str, Tensor], inputs: dict[str, Tensor]
) -> str | None:
    """Why these smoke outputs are unhealthy, or None."""
    for name, value in outputs.items():
        array: npt.NDArray[np.generic] = np.asarray(value)
        if np.issubdtype(array.dtype, np.floating) and not np.isfinite(array).all():
            bad = int(array.size - np.isfinite(array).sum())
            return f"output {name} has {bad} non-finite values (NaN or inf)"
    head = manifest.head
    try:
        if isinstance(head, VadConfig):
            probability = np.asarray(outputs[head.probability]).reshape(-1)
            state = np.asarray(outputs[head.state_out])
            if probability.size < 1 or state.shape != inputs[head.state_in].shape:
                return f"outputs {head.probability}/{head.state_out} have the wrong shapes"
            return None
        spec = manifest.input
        assert isinstance(spec, ImageInput)
        build_frame_head(head).decode(outputs, (spec.width, spec.height))
    except Exception as exc:
        return f"the {head.type} head cannot decode the outputs: {_first_line(exc)}"
    return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    line = text.splitlines()[0]
    return line if len(line) <= 300 else line[:297] + "..."
