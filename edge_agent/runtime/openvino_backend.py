"""OpenVINO backend: the default engine.

Start-up cost matters on a box that restarts: the model file is converted once
(reshape + PrePostProcessor) into an IR in the cache, keyed by the file's
digest and the input spec, and OpenVINO's CACHE_DIR keeps the compiled blob.
A second start compiles straight from the IR path, which lets OpenVINO load
the blob without reading the model at all. Without a cache the converted
model is compiled from memory: nothing is written, so nothing can leak.
"""

from __future__ import annotations

import hashlib
import json
import logging
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import cv2
import numpy as np
import numpy.typing as npt
import openvino as ov
from openvino import _pyopenvino
from openvino.preprocess import ColorFormat, PrePostProcessor

from edge_agent.catalog.fetch import sha256_file
from edge_agent.catalog.manifest import ImageInput, Manifest
from edge_agent.errors import EdgeAgentError
from edge_agent.fsio import fsync_dir, fsync_file
from edge_agent.logs import Throttle, error_text, log_event
from edge_agent.quiet import native_stderr_held
from edge_agent.runtime.base import (
    CompileReport,
    Fallback,
    RuntimeOptions,
    Tensor,
    Tensors,
)
from edge_agent.runtime.cache import prune, touch
from edge_agent.runtime.devices import explain_failure, is_present, parse_request
from edge_agent.runtime.input_check import check_image_input
from edge_agent.runtime.precision import combine, precision_note
from edge_agent.runtime.preprocess import fit_frames, fit_frames_into
from edge_agent.runtime.runs import Slots, ThreadedModel

log = logging.getLogger(__name__)

_PRECISION = {"f32": "f32", "bf16": "bf16", "f16": "f16"}
# Bumped whenever what `_convert` produces changes, so old cached IRs are not reused.
# 4: a uint8 model's RGB order is swapped on the host; 5: the manifest's input is checked
# against the model first (an IR converted from a float model declared u8 ran raw frames).
_PREPARED_LAYOUT = 5

_IR_UNSAVED_LOG_S = 600.0
# Per cache folder: a full disk fails every compile the same way, and a box restoring many
# pipelines (or retrying one) must say so without filling the journal.
_ir_unsaved_said = Throttle(_IR_UNSAVED_LOG_S)

# pyopenvino fills its element type -> numpy dtype table in a C++ function-local static on
# first use, and running that initialiser runs Python (numpy's dtype parsing), which lets
# other threads take the GIL. Two infer requests making their first run at once then
# deadlock: one thread waits for the static's guard holding the GIL, the other waits for
# the GIL inside the guard. Every Python thread stops, so no watchdog of ours can fire; the
# CLI hung with two engine threads in the data dispatcher's `to_dtype()`. Fill the table
# here, once, on the importing thread (the module import lock serialises it).
# tests/unit/test_openvino_first_run.py reproduces the deadlock without this line.
ov.Type.f32.to_dtype()


class CoreLike(Protocol):
    """The part of `openvino.Core` the backend uses; `fake.FakeCore` adds devices we lack."""

    @property
    def available_devices(self) -> list[str]: ...

    def read_model(self, model: str) -> ov.Model: ...

    def compile_model(
        self, model: str | ov.Model, device_name: str, config: dict[str, Any]
    ) -> Any: ...

    def get_property(self, device_name: str, name: str) -> Any: ...


class OpenVinoBackend:
    """Compiles models with OpenVINO, with device fallback and caching."""

    name = "openvino"

    def __init__(self, core: CoreLike | None = None) -> None:
        self.core: CoreLike = core if core is not None else ov.Core()

    def compile(self, path: Path, manifest: Manifest, options: RuntimeOptions) -> OpenVinoModel:
        started = time.perf_counter()
        candidates = parse_request(options.device)  # a bad name fails before any work
        spec = manifest.input
        model_shape = spec.with_shape(options.shape).shape if isinstance(spec, ImageInput) else None
        prepared = self._prepare(path, manifest, options)
        config: dict[str, Any] = {"PERFORMANCE_HINT": options.hint.upper()}
        # An explicit request wins, then the manifest's pin (calibration pins f32 when only
        # FP32 passed its accuracy gate), then the device default.
        precision = options.precision or manifest.precision
        if precision is not None:
            config["INFERENCE_PRECISION_HINT"] = _PRECISION[precision]
        if options.requests is not None:
            config["PERFORMANCE_HINT_NUM_REQUESTS"] = options.requests
        if options.cache_dir is not None:
            config["CACHE_DIR"] = str(options.cache_dir / "compiled")
        compiled, fallbacks = self._compile_first(prepared, candidates, config)
        if compiled is None and isinstance(prepared, Path):
            mended = self._mend_if_damaged(prepared, path, manifest, options)
            if mended is not None:
                compiled, fallbacks = self._compile_first(mended, candidates, config)
        if compiled is None:
            tried = "; ".join(f"{f.device}: {f.reason}" for f in fallbacks)
            raise EdgeAgentError(
                f"no device could run {manifest.name} ({tried})",
                "run `edge-agent doctor` to see which devices this box has",
                code="device.unavailable",
            )
        if options.cache_dir is not None:
            prune(options.cache_dir)  # every version ever run leaves an IR and blobs behind
        devices = [str(d) for d in _prop(compiled, "EXECUTION_DEVICES", [])]
        per_device = _precisions(compiled, devices)
        report = CompileReport(
            backend="openvino",
            requested=options.device,
            device=",".join(devices) or "?",
            fallbacks=tuple(fallbacks),
            precision=combine(per_device) if per_device else "unknown",
            precision_requested=precision,
            precision_note=precision_note(
                precision, per_device, {d: self._capabilities(d) for d in per_device}
            ),
            hint=options.hint,
            requests=options.requests or _pool_size(compiled, options.hint),
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
        return OpenVinoModel(compiled, manifest, report)

    def _compile_first(
        self, prepared: Path | ov.Model, candidates: list[str], config: dict[str, Any]
    ) -> tuple[Any, list[Fallback]]:
        """The first candidate device that compiles `prepared` (None if none did), and why
        each one before it was passed over."""
        available = list(self.core.available_devices)
        fallbacks: list[Fallback] = []
        source = str(prepared) if isinstance(prepared, Path) else prepared
        for candidate in candidates:
            if not is_present(candidate, available):
                fallbacks.append(Fallback(device=candidate, reason=self._absent(candidate)))
                continue
            try:
                return self.core.compile_model(source, candidate, config), fallbacks
            except RuntimeError as exc:
                fallbacks.append(
                    Fallback(device=candidate, reason=explain_failure(_first_line(exc)))
                )
        return None, fallbacks

    def _mend_if_damaged(
        self, xml: Path, path: Path, manifest: Manifest, options: RuntimeOptions
    ) -> Path | ov.Model | None:
        """After no device compiled the cached IR `xml`: if the IR itself does not read (cut
        short by a power cut, say), delete it and prepare the model again; None if it reads,
        and the devices are to blame.

        Before this, a 0-byte .xml was a cache hit on every start and the model failed for
        good as `device.unavailable`, though the cache is only a head start.
        """
        try:
            with native_stderr_held():
                self.core.read_model(str(xml))
        except RuntimeError as exc:
            log_event(
                log,
                logging.WARNING,
                "ir_cache_damaged",
                ir=str(xml),
                model=manifest.name,
                error=_first_line(exc),
                detail="deleted, and converted again from the model file",
            )
            try:
                xml.unlink(missing_ok=True)  # first: the .xml says the pair is complete
                xml.with_suffix(".bin").unlink(missing_ok=True)
            except OSError:  # a cache it cannot mend: this start compiles from memory
                return self._convert(path, manifest, options)
            return self._prepare(path, manifest, options)
        return None

    def _absent(self, candidate: str) -> str:
        """Why a device is missing, when its plugin says (a driver not installed, say)."""
        try:
            self.core.get_property(candidate.split(".")[0], "FULL_DEVICE_NAME")
        except RuntimeError as exc:
            meaning = explain_failure(_first_line(exc))
            if meaning != _first_line(exc):
                return f"not present on this machine: {meaning}"
        return "not present on this machine"

    def _capabilities(self, device: str) -> list[str]:
        try:
            return [str(c) for c in self.core.get_property(device, "OPTIMIZATION_CAPABILITIES")]
        except (RuntimeError, TypeError):  # a device (or a fake one) that does not say
            return []

    def _prepare(self, path: Path, manifest: Manifest, options: RuntimeOptions) -> Path | ov.Model:
        """Return an IR with shape and preprocessing applied, converting at most once.

        Without a cache the model stays in memory: OpenVINO compiles an `ov.Model`
        as well as a file, and a temporary IR would only be one more thing to clean up.
        So does a cache that cannot take the IR (full, read-only): logged, not raised.
        """
        if options.cache_dir is None:
            return self._convert(path, manifest, options)
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
            touch(xml, xml.with_suffix(".bin"))  # used now: the cache's cap deletes by last use
            return xml
        model = self._convert(path, manifest, options)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=folder, prefix=".convert-") as tmp:
                staged = Path(tmp) / "model.xml"
                ov.save_model(model, str(staged), compress_to_fp16=False)
                # On the disk before the renames: unsynced, a power cut after them left a
                # 0-byte .xml under the right name, which every later start took for a hit.
                fsync_file(staged.with_suffix(".bin"))
                fsync_file(staged)
                # The .xml goes last: its presence says the pair is complete.
                staged.with_suffix(".bin").replace(xml.with_suffix(".bin"))
                staged.replace(xml)
                fsync_dir(folder)
        except (OSError, RuntimeError) as exc:
            # The IR cache only saves the next start a conversion. A full or read-only cache
            # disk made this raise (OpenVINO's own `basic_ios::clear: iostream error`), and
            # since IRs are keyed on the OpenVINO version, every upgrade on a full box failed
            # every restore at once: the agent exited and systemd gave up on it.
            if _ir_unsaved_said.ready(str(folder)):
                log_event(
                    log,
                    logging.WARNING,
                    "ir_cache_unwritable",
                    folder=str(folder),
                    model=manifest.name,
                    error=error_text(exc),
                    fix="free space on the cache disk or make the folder writable; until "
                    "then each start converts the model again",
                )
            return model
        return xml

    def prepared_model(self, path: Path, manifest: Manifest, options: RuntimeOptions) -> ov.Model:
        """The graph `compile` compiles: the model file at the options' shape, with the
        frame preprocessing folded in (tools/bench_runtime.py runs benchmark_app on it, to
        tell what the folding costs from what the Python around the engine costs)."""
        return self._convert(path, manifest, options)

    def _convert(self, path: Path, manifest: Manifest, options: RuntimeOptions) -> ov.Model:
        try:
            with native_stderr_held():
                model = self.core.read_model(str(path))
        except RuntimeError as exc:
            raise EdgeAgentError(
                f"cannot read model {path}: {_first_line(exc)}",
                "the file is corrupt, truncated or not a model; fetch it again "
                "(edge-agent models fetch NAME) or check the path",
                code="model.corrupt",
            ) from None
        spec = manifest.input
        shape = options.shape
        if isinstance(spec, ImageInput):
            check_image_input(
                manifest.name,
                spec,
                {
                    name: (_as_declared(port.get_element_type().get_type_name()), _rank(port))
                    for port in model.inputs
                    for name in port.get_names()
                },
            )
            spec = spec.with_shape(shape)
            shape = spec.shape
        if shape is not None:
            try:
                model.reshape({spec.name: ov.PartialShape(list(shape))})
            except RuntimeError as exc:
                raise EdgeAgentError(
                    f"{manifest.name} cannot take input shape {list(shape)}: {_first_line(exc)}",
                    "pass a shape with the model's rank and layout (edge-agent models info NAME)"
                    if options.shape is not None
                    else "set [input] name and shape in the manifest to the model's own",
                    code="model.shape",
                ) from None
        if isinstance(spec, ImageInput):
            try:
                model = _fold_preprocessing(model, spec)
            except RuntimeError as exc:
                if options.shape is not None:
                    raise EdgeAgentError(
                        f"{manifest.name} cannot take input shape {list(spec.shape)} "
                        f"(layout {spec.layout}): {_first_line(exc)}",
                        "pass a shape with the model's rank and layout, at a size it can "
                        "take (edge-agent models info NAME)",
                        code="model.shape",
                    ) from None
                raise EdgeAgentError(
                    f"{manifest.name}'s manifest [input] does not fit the model "
                    f"(layout {spec.layout}, shape {list(spec.shape)}): {_first_line(exc)}",
                    "set [input] name, layout and shape in the manifest to the model's own "
                    "(edge-agent models info NAME shows what the manifest says)",
                    code="model.shape",
                ) from None
        return model


_FLOATS = frozenset({"f16", "bf16", "f64"})


def _as_declared(element_type: str) -> str:
    """An input's element type as a manifest declares it: any float input is `f32`, since
    the folded preprocessing converts to whatever float the model takes (an f16-input
    model, a YOLO exported with half=True, ran so before the check, and must still)."""
    return "f32" if element_type in _FLOATS else element_type


def _rank(port: Any) -> int:
    """A model input's rank, -1 when the file leaves it free."""
    rank = port.get_partial_shape().rank
    return int(rank.get_length()) if rank.is_static else -1


def host_swaps_colour(spec: ImageInput) -> bool:
    """Whether frames reach this model's graph in RGB order, swapped on the host.

    In a float model the swap folds into the first layer with the normalisation and costs
    nothing (face-blazeface: the same FPS under benchmark_app with and without it). A uint8
    model has nothing for it to fold into: the graph then runs the swap as a layer of its
    own, and it cost person-ssdlite 5% of its throughput under benchmark_app (287 against
    303 FPS), against about 20 us a frame for cv2.cvtColor on the host.
    """
    return spec.color == "RGB" and spec.element_type == "u8"


def _fold_preprocessing(model: ov.Model, spec: ImageInput) -> ov.Model:
    """Make the model take uint8 NHWC frames of any size, as cameras deliver them: BGR, or
    RGB where `host_swaps_colour` says the host swaps them."""
    ppp = PrePostProcessor(model)
    inp = ppp.input(spec.name)
    # A static shape at the model's size: the host resizes (see runtime.preprocess).
    # The batch is the model's own: N frames in, N answers out.
    host_rgb = host_swaps_colour(spec)
    inp.tensor().set_element_type(ov.Type.u8).set_layout(ov.Layout("NHWC")).set_color_format(
        ColorFormat.RGB if host_rgb else ColorFormat.BGR
    ).set_shape([spec.shape[0], spec.height, spec.width, 3])
    steps = inp.preprocess()
    if spec.element_type == "f32":
        steps.convert_element_type(ov.Type.f32)
    if spec.color == "RGB" and not host_rgb:
        steps.convert_color(ColorFormat.RGB)
    if spec.element_type == "f32":
        if any(m != 0.0 for m in spec.mean):
            steps.mean(list(spec.mean))
        if any(s != 1.0 for s in spec.scale):
            steps.scale(list(spec.scale))
    inp.model().set_layout(ov.Layout(spec.layout))
    built: ov.Model = ppp.build()
    return built


class OpenVinoModel(ThreadedModel):
    """A compiled model with a pool of infer requests, safe to call from any thread.

    Each run holds one request for its length, sync or async alike: two pipelines
    sharing this model through the pool never meet on one request.
    """

    def __init__(self, compiled: Any, manifest: Manifest, report: CompileReport) -> None:
        size = report.requests
        super().__init__(manifest.name, size)
        self.report = report
        self._compiled: Any = compiled
        spec = manifest.input
        self._image = spec.with_shape(report.model_shape) if isinstance(spec, ImageInput) else None
        self._to_rgb = self._image is not None and host_swaps_colour(self._image)
        # Frames are written into the request's own input tensor (`fit_frames_into`) when
        # the graph's image input has a fixed shape, as the folded graph's always has.
        self._fill = self._image is not None and _static(compiled, self._image.name)
        # Every name of every output, resolved once; heads pick the one their config names.
        self._names = [(i, sorted(o.get_names())) for i, o in enumerate(compiled.outputs)]
        self._copied = _copied_inputs(compiled, self._image)
        # As many requests as the report says (`_pool_size`), made on first need.
        self._requests: Slots[_Lent] = Slots(self._new_request, size)

    def _new_request(self) -> _Lent:
        request = self._compiled.create_infer_request()
        # Views of the buffers each run writes, found once: `get_tensor(name).data` makes a
        # new numpy view on every call. They stay valid because these inputs are never set
        # anew: the image is fitted into its tensor, the small inputs copied into theirs.
        image = self._image
        frames = request.get_tensor(image.name).data if image is not None and self._fill else None
        small = {name: request.get_tensor(name).data for name in self._copied}
        return _Lent(request, frames, small)

    def _run(self, inputs: Mapping[str, Tensor]) -> Tensors:
        spec = self._image
        feed = dict(inputs)
        frames = None
        if spec is not None and spec.name in feed:
            if self._fill:
                frames = feed.pop(spec.name)
            else:
                fitted = fit_frames(feed[spec.name], spec)
                feed[spec.name] = _to_rgb(fitted) if self._to_rgb else fitted
        lent = self._requests.take()
        try:
            if frames is not None:
                # `_fill` set both: the spec, and the view `_new_request` made.
                assert spec is not None
                assert lent.frames is not None
                # The frames fitted (and colour-swapped) into the tensor the request
                # already has, rather than shared in a new tensor each run: a tensor
                # set anew makes the engine rebind its input, and OpenVINO's feed
                # dispatch costs more than the copy. Under the latency hint, where one
                # run is 0.3 ms on a fast model, sharing cost face-blazeface 3% and
                # text-orientation 1% of a bare `infer()` loop (2 cores, alternating
                # 1 s rounds); person-ssdlite's 270 KB frame copies for 0.5%.
                fit_frames_into(frames, spec, lent.frames, self._to_rgb)
            if self._copied:
                feed = _copy_in(lent.small, feed)
            # Both release the GIL while the engine computes, and both copy each output into
            # a new array in C++ (share_outputs=False), which the caller may keep as long as
            # it likes: the request's own buffers are written again by its next run.
            if feed:
                # share_inputs: the request reads the caller's other large inputs in place
                # instead of copying them first (the caller leaves them alone until the run
                # is done). Only OpenVINO's Python wrapper turns arrays into tensors.
                outputs = lent.request.infer(feed, share_inputs=True).to_tuple()
            else:
                outputs = tuple(_ENGINE_INFER(lent.request, feed, False, True).values())
        except RuntimeError as exc:
            raise _failed(exc) from None
        finally:
            self._requests.give(lent)
        found: Tensors = {}
        for index, names in self._names:
            data = outputs[index]
            for name in names:
                found[name] = data
        return found

    def _release(self) -> None:
        # Dropping the last references frees the requests, the compiled model's memory
        # and the engine's threads for it; this runs on a Python thread, never theirs.
        self._requests.clear()
        self._compiled = None


_ENGINE_INFER: Any = _pyopenvino.InferRequest.infer
"""The engine's own synchronous `infer` (pyopenvino's `InferRequest`, which `openvino.InferRequest`
wraps in Python). With every input already in the request there is nothing for the wrapper's
data dispatcher to do, and its result dict is one more object a run: calling below it saved
face-blazeface 4 us and vad-silero 2 us of a run under the latency hint (278 against 282 us,
33 against 35 us; 2 cores, alternating rounds). Arguments: the request, a feed dict (empty),
share_outputs, decode_strings; it returns {output port: array}, in the outputs' order."""


@dataclass(slots=True)
class _Lent:
    """An infer request and views of the input buffers each run writes."""

    request: Any
    frames: npt.NDArray[np.uint8] | None
    """The image input's own tensor, when frames are fitted into it (`_fill`)."""
    small: dict[str, npt.NDArray[Any]]
    """Every name of every input `_copied_inputs` picked, to its tensor."""


def _copy_in(own: Mapping[str, npt.NDArray[Any]], feed: dict[str, Tensor]) -> dict[str, Tensor]:
    """Copy the small inputs into the request's own tensors (`own`); return the rest."""
    rest: dict[str, Tensor] = {}
    for name, value in feed.items():
        target = own.get(name)
        if target is None:
            rest[name] = value
            continue
        if np.shape(value) != target.shape:
            raise EdgeAgentError(
                f"inference failed: input {name} is {np.shape(value)}, the model takes "
                f"{target.shape}",
                "check that the inputs match the model (edge-agent models info NAME)",
                code="inference.failed",
            )
        try:
            np.copyto(target, value, casting="same_kind")
        except TypeError as exc:  # numpy refuses the cast (e.g. a string array)
            raise _failed(exc) from None
    return rest


def _pool_size(compiled: Any, hint: str) -> int:
    """How many infer requests (and worker threads) a model runs with when none is asked for.

    Under the throughput hint, two per request the device runs in parallel. Each run holds
    its request from start to end on a Python worker, sync, so between two runs a stream
    waits while the worker copies the outputs, hands them on and takes the next run; a
    second request per stream has its run queued in the engine already, and the stream goes
    straight on to it, as benchmark_app's callbacks restart a request from inside the
    engine. Measured on 2 cores with alternating rounds: person-ssdlite 342 against 332 FPS,
    text-orientation 1,812 against 1,783, text-det-ppocr 99.3 against 97.4. Under the latency
    hint all cores serve one run, so there is no idle stream to fill: a second request
    measured no gain there (face-blazeface 0.87x of benchmark_app with it, 0.89x without).
    """
    optimal = int(_prop(compiled, "OPTIMAL_NUMBER_OF_INFER_REQUESTS", 1))
    return 2 * optimal if hint == "throughput" else optimal


_COPY_BYTES = 64 * 1024


def _copied_inputs(compiled: Any, image: ImageInput | None) -> frozenset[str]:
    """The names of the inputs a run copies into the request's own tensor instead of sharing.

    Sharing a caller's array means wrapping it in a new tensor and setting it on the
    request every run; for a small input, copying it into the tensor the request already
    has is cheaper. vad-silero (a 2.3 KB window and a 1 KB state), one request, 2 cores:
    36 us a run against 47 us. Only static inputs of at most 64 KB, never the image: a
    frame is large, and copying it would cost more than sharing. An input is either always
    copied or always shared, so a copy never lands in a caller's array shared earlier.
    """
    names: set[str] = set()
    for port in compiled.inputs:
        port_names = set(port.get_names())
        if image is not None and image.name in port_names:
            continue
        shape = port.get_partial_shape()
        if not shape.is_static:
            continue
        size = int(np.prod([d.get_length() for d in shape])) * port.get_element_type().size
        if size <= _COPY_BYTES:
            names |= port_names
    return frozenset(names)


def _static(compiled: Any, name: str) -> bool:
    """Whether the compiled model's input `name` has a fixed shape."""
    return any(
        name in port.get_names() and port.get_partial_shape().is_static for port in compiled.inputs
    )


def _to_rgb(frames: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint8]:
    """N BGR frames as RGB, in a new array: the caller's frames may be its own buffers."""
    out = np.empty_like(frames)
    for i in range(frames.shape[0]):
        cv2.cvtColor(frames[i], cv2.COLOR_BGR2RGB, dst=out[i])
    return out


def _failed(exc: BaseException) -> EdgeAgentError:
    return EdgeAgentError(
        f"inference failed: {_first_line(exc)}",
        "check that the inputs match the model (edge-agent models info NAME)",
        code="inference.failed",
    )


def _precisions(compiled: Any, devices: list[str]) -> dict[str, str]:
    """The precision each executing device really runs, as it reports it after compile.

    A physical device answers INFERENCE_PRECISION_HINT itself; AUTO, MULTI and
    HETERO do not, but list each device's own properties under DEVICE_PROPERTIES.
    """
    own = _prop(compiled, "INFERENCE_PRECISION_HINT", None)
    if own is not None:
        return {device: _type_name(own) for device in devices or ["?"]}
    nested = _prop(compiled, "DEVICE_PROPERTIES", {})
    found: dict[str, str] = {}
    if isinstance(nested, Mapping):
        for device, props in nested.items():
            wanted = not devices or device in devices
            if wanted and isinstance(props, Mapping) and "INFERENCE_PRECISION_HINT" in props:
                found[str(device)] = _type_name(props["INFERENCE_PRECISION_HINT"])
    return found


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
