"""OpenVINO backend: the default engine.

Start-up cost matters on a box that restarts: the model file is converted once
(reshape + PrePostProcessor) into an IR in the cache, keyed by the file's
digest and the input spec, and OpenVINO's CACHE_DIR keeps the compiled blob.
A second start compiles straight from the IR path, which lets OpenVINO load
the blob without reading the model at all.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import openvino as ov
from openvino.preprocess import ColorFormat, PrePostProcessor

from edge_agent.catalog.fetch import sha256_file
from edge_agent.catalog.manifest import ImageInput, Manifest
from edge_agent.errors import EdgeAgentError
from edge_agent.quiet import native_stderr_held
from edge_agent.runtime.base import (
    CompileReport,
    Done,
    Fallback,
    RuntimeOptions,
    Tensor,
    Tensors,
)
from edge_agent.runtime.devices import is_present, parse_request
from edge_agent.runtime.preprocess import fit_frame

_PRECISION = {"f32": "f32", "bf16": "bf16", "f16": "f16"}
# Bumped whenever what `_convert` produces changes, so old cached IRs are not reused.
_PREPARED_LAYOUT = 2


class CoreLike(Protocol):
    """The part of `openvino.Core` the backend uses; `fake.FakeCore` adds devices we lack."""

    @property
    def available_devices(self) -> list[str]: ...

    def read_model(self, model: str) -> ov.Model: ...

    def compile_model(self, model: str, device_name: str, config: dict[str, Any]) -> Any: ...

    def get_property(self, device_name: str, name: str) -> Any: ...


class OpenVinoBackend:
    """Compiles models with OpenVINO, with device fallback and caching."""

    name = "openvino"

    def __init__(self, core: CoreLike | None = None) -> None:
        self.core: CoreLike = core if core is not None else ov.Core()

    def compile(self, path: Path, manifest: Manifest, options: RuntimeOptions) -> OpenVinoModel:
        started = time.perf_counter()
        spec = manifest.input
        model_shape = spec.with_shape(options.shape).shape if isinstance(spec, ImageInput) else None
        prepared = self._prepare(path, manifest, options)
        config: dict[str, Any] = {"PERFORMANCE_HINT": options.hint.upper()}
        if options.precision is not None:
            config["INFERENCE_PRECISION_HINT"] = _PRECISION[options.precision]
        if options.requests is not None:
            config["PERFORMANCE_HINT_NUM_REQUESTS"] = options.requests
        if options.cache_dir is not None:
            config["CACHE_DIR"] = str(options.cache_dir / "compiled")
        available = list(self.core.available_devices)
        fallbacks: list[Fallback] = []
        compiled: Any = None
        for candidate in parse_request(options.device):
            if not is_present(candidate, available):
                fallbacks.append(Fallback(device=candidate, reason="not present on this machine"))
                continue
            try:
                compiled = self.core.compile_model(str(prepared), candidate, config)
                break
            except RuntimeError as exc:
                fallbacks.append(Fallback(device=candidate, reason=_first_line(exc)))
        if compiled is None:
            tried = "; ".join(f"{f.device}: {f.reason}" for f in fallbacks)
            raise EdgeAgentError(
                f"no device could run {manifest.name} ({tried})",
                "run `edge-agent doctor` to see which devices this box has",
            )
        report = CompileReport(
            backend="openvino",
            requested=options.device,
            device=",".join(_prop(compiled, "EXECUTION_DEVICES", ["?"])),
            fallbacks=tuple(fallbacks),
            precision=_type_name(_prop(compiled, "INFERENCE_PRECISION_HINT", "?")),
            hint=options.hint,
            requests=int(_prop(compiled, "OPTIMAL_NUMBER_OF_INFER_REQUESTS", 1)),
            compile_s=time.perf_counter() - started,
            from_cache=bool(_prop(compiled, "LOADED_FROM_CACHE", False)),
            model_shape=model_shape,
            inputs={
                i.get_any_name(): tuple(
                    d.get_length() if d.is_static else -1 for d in i.get_partial_shape()
                )
                for i in compiled.inputs
            },
        )
        return OpenVinoModel(compiled, manifest, report, options.requests)

    def _prepare(self, path: Path, manifest: Manifest, options: RuntimeOptions) -> Path:
        """Return an IR with shape and preprocessing applied, converting at most once."""
        if options.cache_dir is None:
            return self._convert(path, manifest, options, Path(tempfile.mkdtemp(prefix="edge-ir-")))
        key = hashlib.sha256(
            json.dumps(
                {
                    "file": sha256_file(path),
                    "input": manifest.input.model_dump(mode="json"),
                    "shape": options.shape,
                    "openvino": ov.get_version(),
                    "layout": _PREPARED_LAYOUT,
                },
                sort_keys=True,
            ).encode()
        ).hexdigest()[:24]
        folder = options.cache_dir / "ir"
        xml = folder / f"{key}.xml"
        if xml.is_file() and xml.with_suffix(".bin").is_file():
            return xml
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=folder, prefix=".convert-") as tmp:
            staged = self._convert(path, manifest, options, Path(tmp))
            # The .xml goes last: its presence says the pair is complete.
            staged.with_suffix(".bin").replace(xml.with_suffix(".bin"))
            staged.replace(xml)
        return xml

    def _convert(self, path: Path, manifest: Manifest, options: RuntimeOptions, out: Path) -> Path:
        try:
            with native_stderr_held():
                model = self.core.read_model(str(path))
        except RuntimeError as exc:
            raise EdgeAgentError(
                f"cannot read model {path}: {_first_line(exc)}",
                "the file is corrupt, truncated or not a model; fetch it again "
                "(edge-agent models fetch NAME) or check the path",
            ) from None
        spec = manifest.input
        shape = options.shape
        if isinstance(spec, ImageInput):
            spec = spec.with_shape(shape)
            shape = spec.shape
        if shape is not None:
            try:
                model.reshape({spec.name: ov.PartialShape(list(shape))})
            except RuntimeError as exc:
                raise EdgeAgentError(
                    f"{manifest.name} cannot take input shape {list(shape)}: {_first_line(exc)}",
                    "pass a shape with the model's rank and layout (edge-agent models info NAME)",
                ) from None
        if isinstance(spec, ImageInput):
            model = _fold_preprocessing(model, spec)
        xml = out / "model.xml"
        ov.save_model(model, str(xml), compress_to_fp16=False)
        return xml


def _fold_preprocessing(model: ov.Model, spec: ImageInput) -> ov.Model:
    """Make the model take uint8 BGR NHWC frames of any size, as cameras deliver them."""
    ppp = PrePostProcessor(model)
    inp = ppp.input(spec.name)
    # A static shape at the model's size: the host resizes (see runtime.preprocess).
    inp.tensor().set_element_type(ov.Type.u8).set_layout(ov.Layout("NHWC")).set_color_format(
        ColorFormat.BGR
    ).set_shape([1, spec.height, spec.width, 3])
    steps = inp.preprocess()
    if spec.element_type == "f32":
        steps.convert_element_type(ov.Type.f32)
    if spec.color == "RGB":
        steps.convert_color(ColorFormat.RGB)
    if spec.element_type == "f32":
        if any(m != 0.0 for m in spec.mean):
            steps.mean(list(spec.mean))
        if any(s != 1.0 for s in spec.scale):
            steps.scale(list(spec.scale))
    inp.model().set_layout(ov.Layout(spec.layout))
    built: ov.Model = ppp.build()
    return built


class OpenVinoModel:
    """A compiled model with one synchronous request and an async queue."""

    def __init__(
        self, compiled: Any, manifest: Manifest, report: CompileReport, requests: int | None
    ) -> None:
        self.report = report
        self._compiled = compiled
        spec = manifest.input
        self._image = spec.with_shape(report.model_shape) if isinstance(spec, ImageInput) else None
        # Every name of every output, resolved once; heads pick the one their config names.
        self._names = [(i, sorted(o.get_names())) for i, o in enumerate(compiled.outputs)]
        self._request = compiled.create_infer_request()
        self._queue: ov.AsyncInferQueue | None = None
        self._requests = requests or report.requests
        self._lock = threading.Lock()

    def _prepare(self, inputs: Mapping[str, Tensor]) -> dict[str, Tensor]:
        spec = self._image
        if spec is None:
            return dict(inputs)
        return {k: fit_frame(v[0], spec)[None] if k == spec.name else v for k, v in inputs.items()}

    def _outputs(self, request: Any) -> Tensors:
        found: Tensors = {}
        for index, names in self._names:
            # Copy: the request's buffers are reused by its next run.
            data = np.array(request.get_output_tensor(index).data, copy=True)
            for name in names:
                found[name] = data
        return found

    def infer(self, inputs: Mapping[str, Tensor]) -> Tensors:
        try:
            self._request.infer(self._prepare(inputs))
        except RuntimeError as exc:
            raise EdgeAgentError(f"inference failed: {_first_line(exc)}") from None
        return self._outputs(self._request)

    def submit(self, inputs: Mapping[str, Tensor], done: Done, userdata: object) -> None:
        feed = self._prepare(inputs)
        # One lock around "wait for a free request, start it": pipelines sharing this
        # model submit from their own threads, and the clock starts when the engine does.
        with self._lock:
            if self._queue is None:
                self._queue = ov.AsyncInferQueue(self._compiled, self._requests)
                self._queue.set_callback(self._completed)
            self._queue.get_idle_request_id()
            self._queue.start_async(feed, (done, userdata, time.perf_counter()))

    def _completed(self, request: Any, data: tuple[Done, object, float]) -> None:
        # Each submit carries its own `done`, so one compiled model serves many pipelines.
        done, userdata, started = data
        done(self._outputs(request), userdata, time.perf_counter() - started)

    def wait(self) -> None:
        if self._queue is not None:
            self._queue.wait_all()


def _prop(compiled: Any, name: str, default: Any) -> Any:
    try:
        return compiled.get_property(name)
    except RuntimeError:  # not every device supports every property
        return default


def _type_name(value: Any) -> str:
    """'f32' for ov.Type.f32; OpenVINO returns precisions as Type objects."""
    to_string = getattr(value, "to_string", None)
    return str(to_string()) if callable(to_string) else str(value).lower()


def _first_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    # OpenVINO prefixes messages with source locations; the last line says what went wrong.
    useful = [ln for ln in lines if not ln.startswith(("Exception from", "Check '"))]
    return (useful or lines or [type(exc).__name__])[-1][:300]
