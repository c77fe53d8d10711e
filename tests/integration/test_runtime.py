"""Device selection and fallback, the compile cache, async inference."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import numpy.typing as npt
import openvino as ov
import pytest

from edge_agent.catalog.catalog import ResolvedModel
from edge_agent.errors import EdgeAgentError
from edge_agent.infer import infer_frame, read_audio
from edge_agent.runtime.base import RuntimeOptions, Tensors
from edge_agent.runtime.fake import FakeCore
from edge_agent.runtime.openvino_backend import OpenVinoBackend
from tests.conftest import CompileFn, espeak

FACE = "face-blazeface"  # the smallest reference model: compiles in a blink


def _options(cache: Path, **kw: object) -> RuntimeOptions:
    return RuntimeOptions.model_validate({"cache_dir": cache, **kw})


@pytest.fixture
def face(compiled: CompileFn) -> ResolvedModel:
    return compiled(FACE)[1]


def test_missing_gpu_falls_back_to_cpu_and_says_so(face: ResolvedModel, cache_dir: Path) -> None:
    model = OpenVinoBackend().compile(face.path, face.manifest, _options(cache_dir, device="GPU"))
    assert model.report.device == "CPU"
    assert [f.device for f in model.report.fallbacks] == ["GPU"]
    assert "not present" in model.report.fallbacks[0].reason


def test_broken_gpu_driver_falls_back_with_its_reason(
    face: ResolvedModel, cache_dir: Path, astronaut: npt.NDArray[np.uint8]
) -> None:
    core = FakeCore(broken={"GPU": "clCreateContext failed: no OpenCL platform"})
    backend = OpenVinoBackend(core)
    model = backend.compile(face.path, face.manifest, _options(cache_dir, device="GPU,CPU"))
    assert model.report.device == "CPU"
    assert model.report.fallbacks[0].device == "GPU"
    assert "clCreateContext failed" in model.report.fallbacks[0].reason
    assert infer_frame(model, face.manifest, astronaut)  # and it still finds the face


def test_priority_list_takes_first_working_device(face: ResolvedModel, cache_dir: Path) -> None:
    core = FakeCore(working=("GPU",), broken={"NPU": "NPU firmware not loaded"})
    model = OpenVinoBackend(core).compile(
        face.path, face.manifest, _options(cache_dir, device="NPU,GPU,CPU")
    )
    assert model.report.device == "GPU"
    assert [(f.device, f.reason) for f in model.report.fallbacks] == [
        ("NPU", "NPU firmware not loaded")
    ]


def test_no_device_works_is_a_clear_error(face: ResolvedModel, cache_dir: Path) -> None:
    class NoCpu(FakeCore):
        @property
        def available_devices(self) -> list[str]:
            return ["GPU"]

    broken_only = NoCpu(broken={"GPU": "driver gone"})
    with pytest.raises(EdgeAgentError, match=r"no device could run .*GPU: driver gone"):
        OpenVinoBackend(broken_only).compile(
            face.path, face.manifest, _options(cache_dir, device="GPU")
        )


def test_auto_reports_the_device_it_chose(face: ResolvedModel, cache_dir: Path) -> None:
    model = OpenVinoBackend().compile(face.path, face.manifest, _options(cache_dir, device="AUTO"))
    assert model.report.requested == "AUTO"
    assert "CPU" in model.report.device


@pytest.mark.parametrize("bad", ["TPU", "GPU,,CPU", "", "cuda:0"])
def test_unknown_device_is_rejected(face: ResolvedModel, cache_dir: Path, bad: str) -> None:
    with pytest.raises(EdgeAgentError, match="device"):
        OpenVinoBackend().compile(face.path, face.manifest, _options(cache_dir, device=bad))


def test_second_compile_comes_from_cache(face: ResolvedModel, tmp_path: Path) -> None:
    backend = OpenVinoBackend()
    first = backend.compile(face.path, face.manifest, _options(tmp_path, hint="throughput"))
    second = backend.compile(face.path, face.manifest, _options(tmp_path, hint="throughput"))
    assert not first.report.from_cache
    assert second.report.from_cache
    assert list((tmp_path / "ir").glob("*.xml")), "the prepared IR is kept"
    assert list((tmp_path / "compiled").iterdir()), "the compiled blob is kept"


def test_explicit_precision_is_applied_and_reported(face: ResolvedModel, cache_dir: Path) -> None:
    model = OpenVinoBackend().compile(
        face.path, face.manifest, _options(cache_dir, precision="f32")
    )
    assert model.report.precision == "f32"


def test_async_results_match_sync(compiled: CompileFn, astronaut: npt.NDArray[np.uint8]) -> None:
    model, resolved = compiled("person-ssdlite", hint="throughput")
    name = resolved.manifest.input.name
    frames = [astronaut, astronaut[:, ::-1].copy(), astronaut[100:, :400].copy()] * 4
    expected = [model.infer({name: f[None]})["detection_scores:0"] for f in frames]
    got: dict[int, Tensors] = {}
    lock = threading.Lock()

    def done(outputs: Tensors, index: object, latency: float) -> None:
        assert latency > 0
        with lock:
            got[int(index)] = outputs  # type: ignore[call-overload]

    for i, frame in enumerate(frames):
        model.submit({name: frame[None]}, done, i)
    model.wait()
    assert sorted(got) == list(range(len(frames)))
    for i, scores in enumerate(expected):
        np.testing.assert_allclose(
            np.asarray(got[i]["detection_scores:0"], dtype=np.float32),
            np.asarray(scores, dtype=np.float32),
            atol=1e-4,
        )


def test_outputs_are_the_callers_and_survive_the_request_s_next_run(
    compiled: CompileFn, astronaut: npt.NDArray[np.uint8]
) -> None:
    # The latency hint runs one request, so the second run writes into the very buffers
    # the first run's outputs came from: what the caller got must be a copy of its own.
    model, resolved = compiled("person-ssdlite", hint="latency")
    assert model.report.requests == 1
    name = resolved.manifest.input.name
    first = model.infer({name: astronaut[None]})
    kept = {key: np.array(value, copy=True) for key, value in first.items()}
    second = model.infer({name: astronaut[::-1].copy()[None]})
    for key, value in first.items():
        np.testing.assert_array_equal(value, kept[key])
    assert not np.array_equal(first["detection_boxes:0"], second["detection_boxes:0"])
    assert float(np.max(first["detection_scores:0"])) > 0.5, "the astronaut is found"


def test_small_inputs_are_copied_into_each_request_and_give_the_engines_answers(
    compiled: CompileFn, tmp_path: Path
) -> None:
    # vad-silero's two inputs (a window and the state) are small enough that each run
    # copies them into its request's own tensors. Windows of real speech, each with the
    # state the model itself produced for it, run sequentially on OpenVINO's own request,
    # then all at once through the model's four requests: every answer must be the
    # engine's, whichever request ran it, and the caller's arrays stay as they were.
    model, resolved = compiled("vad-silero", hint="throughput", precision="f32")
    assert model.report.requests > 1
    speech = read_audio(espeak("turn on the lights in the loading dock", tmp_path / "a.wav"), 16000)
    raw = ov.Core().compile_model(str(resolved.path), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    request = raw.create_infer_request()
    state = np.zeros((2, 1, 128), dtype=np.float32)
    feeds: list[dict[str, npt.NDArray[np.float32]]] = []
    want: list[float] = []
    for start in range(0, 40 * 512, 512):
        window = np.ascontiguousarray(speech[None, start : start + 576], dtype=np.float32)
        feeds.append({"input": window, "state": state})
        out = request.infer({"input": window, "state": state})
        want.append(float(out["output"].ravel()[0]))
        state = np.array(out["stateN"], dtype=np.float32)
    assert max(want) > 0.5 > min(want), "the clip has speech and silence"
    before = [{k: v.copy() for k, v in f.items()} for f in feeds]
    got: dict[int, float] = {}
    lock = threading.Lock()

    def done(outputs: Tensors, index: object, latency: float) -> None:
        with lock:
            got[int(index)] = float(np.asarray(outputs["output"]).ravel()[0])  # type: ignore[call-overload]

    for i, feed in enumerate(feeds):
        model.submit(feed, done, i)
    model.wait()
    np.testing.assert_allclose([got[i] for i in range(len(feeds))], want, atol=1e-5)
    for feed, copy in zip(feeds, before, strict=True):
        for name in feed:
            np.testing.assert_array_equal(feed[name], copy[name])
    with pytest.raises(EdgeAgentError) as wrong:
        model.infer({"input": feeds[0]["input"][:, :512], "state": feeds[0]["state"]})
    assert wrong.value.code == "inference.failed"
    assert "(1, 512)" in str(wrong.value)
    assert "(1, 576)" in str(wrong.value)
    again = model.infer(feeds[5])  # the model still serves
    assert float(np.asarray(again["output"]).ravel()[0]) == pytest.approx(want[5], abs=1e-5)
