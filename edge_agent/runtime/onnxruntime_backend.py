"""ONNX Runtime backend: the second engine, for ONNX files only.

Set up the way a hand-tuned `InferenceSession` is, per hint, so comparisons
against OpenVINO are fair ("core" is a CPU this process may use, `procstats.usable_cpus`):
- latency: one run at a time, every core working inside it (intra-op threads),
  sequential execution, every graph optimisation;
- throughput: one run per core at once on the same session, each single-threaded.
  ORT's `run` is thread-safe, and on small CNNs parallel single-threaded runs beat
  one wide run (text-orientation on 2 cores: about 550 against 470 FPS), because a
  wide run stalls on its threads' barriers between layers.
Preprocessing runs in numpy (runtime.preprocess), the reference for what OpenVINO
folds in, on the worker threads so it overlaps with other runs.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import onnxruntime as ort

from edge_agent.catalog.manifest import ImageInput, InputSpec, Manifest
from edge_agent.errors import EdgeAgentError
from edge_agent.procstats import usable_cpus
from edge_agent.runtime.base import (
    CompileReport,
    Fallback,
    Hint,
    RuntimeOptions,
    Tensor,
    Tensors,
)
from edge_agent.runtime.devices import parse_request
from edge_agent.runtime.input_check import check_image_input
from edge_agent.runtime.preprocess import frames_tensor
from edge_agent.runtime.runs import ThreadedModel


def session_options(hint: Hint, requests: int | None, cores: int) -> tuple[ort.SessionOptions, int]:
    """ORT's settings for a hint on `cores` cores, and how many runs go at once."""
    workers = requests or (1 if hint == "latency" else cores)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    # The cores are shared out between the runs in flight, never oversubscribed.
    so.intra_op_num_threads = max(1, cores // workers)
    so.inter_op_num_threads = 1  # used only by the parallel executor, which CNNs do not gain from
    so.log_severity_level = 3
    return so, workers


_OPENVINO = 'the openvino backend (--backend openvino; backend = "openvino" in a pipeline\'s model)'
"""How to ask for the other engine, in the CLI and in an agent's pipeline spec alike: the
agent answers with these fixes too, and it has no --backend flag."""


class OnnxRuntimeBackend:
    """CPU execution through ONNX Runtime."""

    name = "onnxruntime"

    def compile(self, path: Path, manifest: Manifest, options: RuntimeOptions) -> OnnxRuntimeModel:
        if manifest.format != "onnx":
            raise EdgeAgentError(
                f"ONNX Runtime cannot read {manifest.name}: it is a {manifest.format} model",
                f"use {_OPENVINO}, which reads ONNX, IR, TFLite and TF",
                code="model.incompatible",
            )
        started = time.perf_counter()
        # Only the CPU provider ships in the onnxruntime wheel; others are reported fallbacks.
        fallbacks = tuple(
            Fallback(device=d, reason="the onnxruntime backend runs on CPU only")
            for d in parse_request(options.device)
            if d != "CPU"
        )
        # The CPUs this process may use, not the box's: under taskset, a unit's CPUAffinity=
        # or CPUQuota=, or a container's cpuset, os.cpu_count() ran 16 spinning threads (or
        # 16 parallel runs) on 2 CPUs of a 16-core host. OpenVINO follows affinity itself.
        cores = max(1, int(usable_cpus()))
        so, workers = session_options(options.hint, options.requests, cores)
        try:
            session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        except Exception as exc:  # ORT raises its own Fail/InvalidProtobuf types
            raise load_error(path, exc) from None
        spec = manifest.input
        if isinstance(spec, ImageInput):
            check_image_input(
                manifest.name,
                spec,
                {
                    i.name: (_ORT_TYPES.get(i.type, i.type), len(i.shape))
                    for i in session.get_inputs()
                },
            )
            spec = spec.with_shape(options.shape)
        inputs = {
            i.name: tuple(d if isinstance(d, int) else -1 for d in i.shape)
            for i in session.get_inputs()
        }
        wanted = spec.shape if isinstance(spec, ImageInput) else options.shape
        if wanted is not None:
            _check_shape(manifest.name, spec.name, inputs.get(spec.name), wanted)
            inputs[spec.name] = wanted
        if isinstance(spec, ImageInput):
            inputs[spec.name] = (spec.shape[0], spec.height, spec.width, 3)  # frames
        report = CompileReport(
            backend="onnxruntime",
            requested=options.device,
            device="CPU",
            fallbacks=fallbacks,
            precision="f32",
            precision_requested=options.precision or manifest.precision,
            precision_note=_precision_note(options.precision or manifest.precision),
            hint=options.hint,
            requests=workers,
            compile_s=time.perf_counter() - started,
            from_cache=False,
            inputs=inputs,
            model_shape=spec.shape if isinstance(spec, ImageInput) else None,
        )
        return OnnxRuntimeModel(session, manifest.name, spec, report)


_ORT_TYPES = {"tensor(float)": "f32", "tensor(uint8)": "u8"}
_STATUS = re.compile(r"\[ONNXRuntimeError\] : \d+ : (\w+) : ")
_LOAD_FAILED = re.compile(r"^Load model from .*? failed:\s*")
# ORT prefixes the reason with the C++ source location and the function's signature:
# "/onnxruntime_src/.../model_load_utils.h:46 void onnxruntime::...(const std::...&, int) ".
_SOURCE = re.compile(r"/\S+:\d+ [^()]*\([^()]*\)\s*")
_OPSET = re.compile(r"\b[Oo]pset (\d+)\b")
_SUPPORTED_OPSET = re.compile(r"support for domain (\S+) is till opset (\d+)")
_NO_OP = re.compile(r"No Op registered for (\S+)")
_REASON_CHARS = 300


def ort_reason(exc: BaseException) -> str:
    """What went wrong, from an ONNX Runtime exception: its status prefix, the file name it
    repeats and the C++ source location dropped, never empty.

    Cut at 300 characters as it came, ORT's message was all source path and signature (a
    model at opset 99 said `...model_load_utils.h:46 void onnxruntime::model_load_utils::
    ValidateOpsetForDomain(const std::unordered_map<...`), and an empty one raised.
    """
    text = " ".join(str(exc).split())
    text = _LOAD_FAILED.sub("", _STATUS.sub("", text, count=1), count=1)
    text = _SOURCE.sub("", text).strip()
    if not text:
        return type(exc).__name__
    return text if len(text) <= _REASON_CHARS else text[: _REASON_CHARS - 3] + "..."


def load_error(path: Path, exc: BaseException) -> EdgeAgentError:
    """The error for a file ONNX Runtime could not load, by what ORT said: an opset or an
    operator it does not support is not a damaged file, and fetching it again cannot help."""
    whole = " ".join(str(exc).split())
    status = _STATUS.search(whole)
    engine = f"ONNX Runtime {ort.__version__}"
    unsupported = (
        f"the model needs a newer ONNX Runtime than {ort.__version__}, or run it on "
        f"{_OPENVINO} (or re-export it at an opset this version supports)"
    )
    opset = _OPSET.search(whole)
    if opset is not None and "support" in whole:
        limit = _SUPPORTED_OPSET.search(whole)
        upto = f" (it supports {limit[1]} up to opset {limit[2]})" if limit else ""
        return EdgeAgentError(
            f"{engine} cannot run {path}: it is stamped with opset {opset[1]}{upto}",
            unsupported,
            code="model.incompatible",
        )
    no_op = _NO_OP.search(whole)
    if no_op is not None or (status is not None and status[1] == "NOT_IMPLEMENTED"):
        what = (
            f"has no operator {no_op[1]}"
            if no_op
            else f"uses what it does not implement ({ort_reason(exc)})"
        )
        return EdgeAgentError(
            f"{engine} cannot run {path}: it {what}",
            unsupported,
            code="model.incompatible",
        )
    return EdgeAgentError(
        f"cannot read model {path}: {ort_reason(exc)}",
        "the file is corrupt, truncated or not an ONNX model; fetch it again",
        code="model.corrupt",
    )


def _precision_note(requested: str | None) -> str:
    if requested in (None, "f32"):
        return ""
    return (
        f"{requested} requested, onnxruntime runs f32: its CPU provider computes in f32 only "
        f"(use {_OPENVINO} for {requested})"
    )


def _check_shape(
    model: str, name: str, fixed: tuple[int, ...] | None, wanted: tuple[int, ...]
) -> None:
    """ORT cannot reshape a model: a shape is fine only where the file leaves dims free."""
    if fixed is None:
        return
    clash = len(fixed) != len(wanted) or any(
        f != -1 and f != w for f, w in zip(fixed, wanted, strict=False)
    )
    if clash:
        free = ",".join("N" if d == -1 else str(d) for d in fixed)
        raise EdgeAgentError(
            f"{model}'s ONNX input {name} is fixed at {free}; ONNX Runtime cannot run it "
            f"at {','.join(map(str, wanted))}",
            f"change only the free (N) dims, or use {_OPENVINO}, which reshapes models",
            code="model.shape",
        )


class OnnxRuntimeModel(ThreadedModel):
    """A session shared by any number of threads; `submit` runs on the hint's workers."""

    def __init__(
        self, session: ort.InferenceSession, name: str, spec: InputSpec, report: CompileReport
    ) -> None:
        super().__init__(name, report.requests)
        self.report = report
        self._session: ort.InferenceSession | None = session
        self._spec = spec
        self._output_names = [o.name for o in session.get_outputs()]
        # Each worker's last input tensor, written over by its next run: `run` is done
        # with its inputs when it returns, and the worker runs one at a time.
        self._buffers = threading.local()

    def _run(self, inputs: Mapping[str, Tensor]) -> Tensors:
        session = self._session
        assert session is not None, "Runs admits no run after close"
        spec = self._spec
        feed = dict(inputs)
        if isinstance(spec, ImageInput) and spec.name in feed:
            buffers = self._buffers
            tensor = frames_tensor(feed[spec.name], spec, getattr(buffers, "tensor", None))
            feed[spec.name] = buffers.tensor = tensor
        try:
            values = session.run(self._output_names, feed)  # thread-safe; releases the GIL
        except Exception as exc:  # ORT raises its own exception types for bad feeds
            raise EdgeAgentError(
                f"inference failed: {ort_reason(exc)}",
                "check that the inputs match the model (edge-agent models info NAME)",
                code="inference.failed",
            ) from None
        return dict(zip(self._output_names, values, strict=True))

    def _release(self) -> None:
        self._session = None  # the last reference: ORT frees the session's memory
