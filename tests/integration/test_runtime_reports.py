"""Compile reports tell the truth: precision used and why, device fallbacks, batches."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import openvino as ov
import pytest

from edge_agent.bench import run_bench
from edge_agent.catalog.catalog import ResolvedModel
from edge_agent.errors import EdgeAgentError
from edge_agent.infer import infer_frame
from edge_agent.runtime import create_backend
from edge_agent.runtime.base import CompiledModel, RuntimeOptions
from edge_agent.runtime.fake import FakeCore
from edge_agent.runtime.openvino_backend import OpenVinoBackend
from tests.conftest import sample

Resolve = Callable[[str], ResolvedModel]
ORIENTATION = "text-orientation"  # ONNX, small, dynamic batch: runs on both engines
CPU_CAPS = [str(c) for c in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")]
CPU_DEFAULT = "bf16" if "BF16" in CPU_CAPS else "f32"


def _compile(
    resolve: Resolve, cache: Path, backend: str = "openvino", **kw: object
) -> CompiledModel:
    resolved = resolve(ORIENTATION)
    options = RuntimeOptions.model_validate({"cache_dir": cache, **kw})
    return create_backend(backend).compile(resolved.path, resolved.manifest, options)


def test_default_precision_is_the_devices_and_needs_no_note(
    resolve: Resolve, cache_dir: Path
) -> None:
    with _compile(resolve, cache_dir) as model:
        assert model.report.precision == CPU_DEFAULT
        assert model.report.precision_requested is None
        assert model.report.precision_note == ""


@pytest.mark.parametrize(("hint", "per_stream"), [("throughput", 2), ("latency", 1)])
def test_requests_are_two_per_parallel_stream_under_the_throughput_hint(
    resolve: Resolve, cache_dir: Path, hint: str, per_stream: int
) -> None:
    resolved = resolve(ORIENTATION)
    config = {"PERFORMANCE_HINT": hint.upper()}
    optimal = ov.Core().compile_model(str(resolved.path), "CPU", config)
    streams = int(optimal.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS"))
    with _compile(resolve, cache_dir, hint=hint) as model:
        assert model.report.requests == per_stream * streams
        # And the model runs that many at once: a bench keeps them all busy.
        assert run_bench(model, resolved.manifest, 0.3).iterations > model.report.requests
    with _compile(resolve, cache_dir, hint=hint, requests=3) as model:
        assert model.report.requests == 3  # an explicit count is taken as it is


def test_honoured_precision_has_no_note(resolve: Resolve, cache_dir: Path) -> None:
    with _compile(resolve, cache_dir, precision="f32") as model:
        assert (model.report.precision, model.report.precision_requested) == ("f32", "f32")
        assert model.report.precision_note == ""


def test_f16_on_a_cpu_without_f16_says_what_ran_and_why(resolve: Resolve, cache_dir: Path) -> None:
    with _compile(resolve, cache_dir, precision="f16") as model:
        report = model.report
    assert report.precision_requested == "f16"
    if "FP16" in CPU_CAPS:  # a CPU with f16 arithmetic honours it
        assert (report.precision, report.precision_note) == ("f16", "")
        return
    # This project's CI box (avx512_bf16, no AMX-FP16) runs f16 requests at bf16.
    assert report.precision == CPU_DEFAULT
    assert report.precision_note.startswith(f"f16 requested, CPU runs {CPU_DEFAULT}")
    assert "no f16 arithmetic" in report.precision_note


@pytest.mark.parametrize("device", ["AUTO", "AUTO:CPU", "MULTI:CPU", "HETERO:CPU"])
def test_virtual_devices_report_the_precision_of_the_device_under_them(
    resolve: Resolve, cache_dir: Path, device: str
) -> None:
    with _compile(resolve, cache_dir, device=device) as model:
        assert model.report.precision == CPU_DEFAULT, "not '?'"
    with _compile(resolve, cache_dir, device=device, precision="f32") as model:
        assert model.report.precision == "f32"
        assert model.report.precision_note == ""


@pytest.mark.parametrize("asked", ["bf16", "f16"])
def test_onnxruntime_says_it_runs_f32_whatever_is_asked(
    resolve: Resolve, cache_dir: Path, asked: str
) -> None:
    with _compile(resolve, cache_dir, "onnxruntime", precision=asked) as model:
        report = model.report
    assert (report.precision, report.precision_requested) == ("f32", asked)
    assert report.precision_note.startswith(f"{asked} requested, onnxruntime runs f32")


def test_manifest_pin_is_the_request_when_no_option_is_given(
    resolve: Resolve, cache_dir: Path
) -> None:
    resolved = resolve(ORIENTATION)
    pinned = resolved.manifest.model_copy(update={"precision": "f32"})
    backend = create_backend("openvino")
    with backend.compile(resolved.path, pinned, RuntimeOptions(cache_dir=cache_dir)) as model:
        assert (model.report.precision, model.report.precision_requested) == ("f32", "f32")


def test_a_missing_gpu_runtime_is_explained_once_in_our_words(
    resolve: Resolve, cache_dir: Path
) -> None:
    """A real AUTO:GPU,CPU on this box: OpenVINO's GPU plugin cannot load libOpenCL."""
    with _compile(resolve, cache_dir, device="AUTO:GPU,CPU") as model:
        report = model.report
    if "GPU" in report.device:
        return  # a box with a working GPU: nothing to explain
    assert report.device == "CPU"
    for fallback in report.fallbacks:
        assert "cannot open shared object" not in fallback.reason
        assert "/" not in fallback.reason, "no install paths"
    if "libOpenCL" in " ".join(f.reason for f in report.fallbacks):
        assert report.fallbacks[0].reason == (
            "no OpenCL runtime (libOpenCL.so.1) installed; install intel-opencl-icd"
        )


def test_a_broken_driver_message_is_rewritten(resolve: Resolve, cache_dir: Path) -> None:
    raw = (
        'Cannot load library "/opt/venv/openvino/libs/libopenvino_intel_gpu_plugin.so": '
        "libOpenCL.so.1: cannot open shared object file: No such file or directory"
    )
    backend = OpenVinoBackend(FakeCore(broken={"GPU": raw}))
    resolved = resolve(ORIENTATION)
    options = RuntimeOptions(cache_dir=cache_dir, device="GPU")
    with backend.compile(resolved.path, resolved.manifest, options) as model:
        assert [(f.device, f.reason) for f in model.report.fallbacks] == [
            ("GPU", "no OpenCL runtime (libOpenCL.so.1) installed; install intel-opencl-icd")
        ]


@pytest.mark.parametrize("bad", ["AUTO:TPU", "MULTI:GPU,MYRIAD"])
def test_virtual_device_with_an_unknown_name_is_refused(
    resolve: Resolve, cache_dir: Path, bad: str
) -> None:
    with pytest.raises(EdgeAgentError, match="unknown device") as info:
        _compile(resolve, cache_dir, device=bad)
    assert info.value.code == "device.invalid"


@pytest.mark.parametrize("backend", ["openvino", "onnxruntime"])
def test_batch_of_two_runs_two_frames_and_benches(
    resolve: Resolve, cache_dir: Path, backend: str
) -> None:
    resolved = resolve(ORIENTATION)
    page = sample("page")
    pages = [np.repeat(np.rot90(page, k)[:, :, None], 3, axis=2) for k in (0, 2)]
    with _compile(resolve, cache_dir, backend, shape=(2, 3, 224, 224), precision="f32") as model:
        assert model.report.inputs["x"] == (2, 224, 224, 3)
        both = np.stack([np.ascontiguousarray(p) for p in pages])
        batched = model.infer({"x": both})["fetch_name_0"]
        assert batched.shape == (2, 4)
        result = run_bench(model, resolved.manifest, 0.3)
        assert result.batch == 2
        assert result.throughput_fps == pytest.approx(2 * result.iterations / result.seconds)
        with pytest.raises(EdgeAgentError, match="batch 2") as info:
            infer_frame(model, resolved.manifest, pages[0])
        assert info.value.code == "model.shape"
    with _compile(resolve, cache_dir, backend, precision="f32") as single:
        for i, frame in enumerate(pages):
            alone = single.infer({"x": np.ascontiguousarray(frame)[None]})["fetch_name_0"]
            np.testing.assert_allclose(
                np.asarray(batched[i], np.float32), np.asarray(alone[0], np.float32), atol=1e-4
            )


def test_onnxruntime_refuses_a_batch_the_file_fixes(resolve: Resolve, cache_dir: Path) -> None:
    resolved = resolve("vad-silero")  # its ONNX input is fixed at 1x576
    options = RuntimeOptions(cache_dir=cache_dir, shape=(2, 576))
    with pytest.raises(EdgeAgentError, match="fixed at 1,576") as info:
        create_backend("onnxruntime").compile(resolved.path, resolved.manifest, options)
    assert info.value.code == "model.shape"


@pytest.mark.parametrize("seconds", [0.0, -1.0, float("nan")])
def test_bench_refuses_a_time_that_is_not_positive(
    resolve: Resolve, cache_dir: Path, seconds: float
) -> None:
    with (
        _compile(resolve, cache_dir, "onnxruntime") as model,
        pytest.raises(EdgeAgentError, match="must be positive") as info,
    ):
        run_bench(model, resolve(ORIENTATION).manifest, seconds)
    assert info.value.code == "input.invalid"
