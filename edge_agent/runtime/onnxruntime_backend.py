"""ONNX Runtime backend: the second engine, for ONNX files only.

Given its best CPU settings (every graph optimisation, one intra-op thread
per core) so that comparisons against OpenVINO are fair. Preprocessing runs
in numpy (runtime.preprocess), the reference for what OpenVINO folds in.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import onnxruntime as ort

from edge_agent.catalog.manifest import ImageInput, InputSpec, Manifest
from edge_agent.errors import EdgeAgentError
from edge_agent.runtime.base import CompileReport, Done, Fallback, RuntimeOptions, Tensor, Tensors
from edge_agent.runtime.devices import parse_request
from edge_agent.runtime.preprocess import frame_tensor


class OnnxRuntimeBackend:
    """CPU execution through ONNX Runtime."""

    name = "onnxruntime"

    def compile(self, path: Path, manifest: Manifest, options: RuntimeOptions) -> OnnxRuntimeModel:
        if manifest.format != "onnx":
            raise EdgeAgentError(
                f"ONNX Runtime cannot read {manifest.name}: it is a {manifest.format} model",
                "use --backend openvino, which reads ONNX, IR, TFLite and TF",
            )
        started = time.perf_counter()
        # Only the CPU provider ships in the onnxruntime wheel; others are reported fallbacks.
        fallbacks = tuple(
            Fallback(device=d, reason="the onnxruntime backend runs on CPU only")
            for d in parse_request(options.device)
            if d != "CPU"
        )
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.intra_op_num_threads = os.cpu_count() or 1
        so.log_severity_level = 3
        try:
            session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        except Exception as exc:  # ORT raises its own Fail/InvalidProtobuf types
            raise EdgeAgentError(
                f"cannot read model {path}: {str(exc).splitlines()[0][:300]}",
                "the file is corrupt, truncated or not an ONNX model; fetch it again",
            ) from None
        spec = manifest.input
        if isinstance(spec, ImageInput):
            spec = spec.with_shape(options.shape)
        inputs = {
            i.name: tuple(d if isinstance(d, int) else -1 for d in i.shape)
            for i in session.get_inputs()
        }
        if isinstance(spec, ImageInput):
            inputs[spec.name] = (1, spec.height, spec.width, 3)  # frames; the host resizes
        report = CompileReport(
            backend="onnxruntime",
            requested=options.device,
            device="CPU",
            fallbacks=fallbacks,
            precision="f32",
            hint=options.hint,
            requests=1,
            compile_s=time.perf_counter() - started,
            from_cache=False,
            inputs=inputs,
            model_shape=spec.shape if isinstance(spec, ImageInput) else None,
        )
        return OnnxRuntimeModel(session, spec, report)


class OnnxRuntimeModel:
    """A session; `submit` runs on one worker thread (ORT already uses every core per run)."""

    def __init__(self, session: ort.InferenceSession, spec: InputSpec, report: CompileReport):
        self.report = report
        self._session = session
        self._spec = spec
        self._output_names = [o.name for o in session.get_outputs()]
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ort")
        self._pending: list[Future[None]] = []

    def _feed(self, inputs: Mapping[str, Tensor]) -> dict[str, Tensor]:
        spec = self._spec
        if isinstance(spec, ImageInput):
            return {k: frame_tensor(v[0], spec) if k == spec.name else v for k, v in inputs.items()}
        return dict(inputs)

    def infer(self, inputs: Mapping[str, Tensor]) -> Tensors:
        try:
            values = self._session.run(self._output_names, self._feed(inputs))
        except Exception as exc:  # ORT raises its own exception types for bad feeds
            raise EdgeAgentError(f"inference failed: {str(exc).splitlines()[0][:300]}") from None
        return dict(zip(self._output_names, values, strict=True))

    def submit(self, inputs: Mapping[str, Tensor], done: Done, userdata: object) -> None:
        def _run() -> None:
            started = time.perf_counter()
            outputs = self.infer(inputs)
            done(outputs, userdata, time.perf_counter() - started)

        self._pending = [f for f in self._pending if not f.done()]
        # Keep at most two queued so a fast producer cannot grow memory without bound.
        while len(self._pending) >= 2:
            self._pending.pop(0).result()
        self._pending.append(self._pool.submit(_run))

    def wait(self) -> None:
        for future in self._pending:
            future.result()
        self._pending.clear()
