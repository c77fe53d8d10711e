"""A centre-cropped model sees its crop once, through `infer` and through a pipeline.

text-orientation keeps the centred 87.5% of the short side. `infer` and the pipelines fit
the whole frame (crop, then resize) on the host; the engine must take that fitted frame as
the model's input. It used to crop it again (0.875 squared of the short side) and resize it
back, on both engines. The reference here is computed by hand with numpy and cv2 from the
same photo, through the bare ONNX file.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import numpy.typing as npt
import onnxruntime as ort
import pytest

from edge_agent.catalog.catalog import Catalog, ResolvedModel
from edge_agent.catalog.manifest import ImageInput
from edge_agent.heads.base import Classification
from edge_agent.infer import infer_frame
from edge_agent.pipelines.base import FrameResult
from edge_agent.pipelines.runner import PipelineHandle
from edge_agent.pipelines.sinks import CallbackSink
from edge_agent.pipelines.sources import FolderSourceSpec
from edge_agent.pipelines.spec import ModelRef, PipelineSpec
from edge_agent.runtime.pool import ModelPool
from edge_agent.runtime.preprocess import fit_frames_into, frames_tensor
from tests.conftest import CompileFn, sample

Frame = npt.NDArray[np.uint8]
Seen = list[npt.NDArray[Any]]


def _page() -> Frame:
    """scikit-image's scanned page, turned a quarter and made BGR: 384 x 191."""
    grey = np.ascontiguousarray(np.rot90(sample("page")))
    return np.asarray(cv2.cvtColor(grey, cv2.COLOR_GRAY2BGR), dtype=np.uint8)


def _fitted_once(frame: Frame, spec: ImageInput) -> Frame:
    """The centred square of 0.875 of the short side, resized to the model's size."""
    height, width = frame.shape[:2]
    side = round(min(height, width) * spec.center_crop)
    top, left = (height - side) // 2, (width - side) // 2
    square = frame[top : top + side, left : left + side]
    return np.asarray(
        cv2.resize(square, (spec.width, spec.height), interpolation=cv2.INTER_LINEAR),
        dtype=np.uint8,
    )


def _normalised(image: Frame, spec: ImageInput) -> npt.NDArray[np.float32]:
    """BGR, (x - mean) / scale, NCHW: the manifest's input, written out by hand."""
    mean = np.asarray(spec.mean, dtype=np.float32)
    scale = np.asarray(spec.scale, dtype=np.float32)
    planes = (image.astype(np.float32) - mean) / scale
    return np.ascontiguousarray(planes.transpose(2, 0, 1)[None])


def _watch(monkeypatch: pytest.MonkeyPatch, backend: str) -> Seen:
    """Record the image each engine is given: ORT's float tensor, OpenVINO's uint8 frame
    (its graph normalises)."""
    seen: Seen = []
    if backend == "onnxruntime":

        def tensor(*args: Any) -> npt.NDArray[Any]:
            out = frames_tensor(*args)
            seen.append(out.copy())
            return out

        monkeypatch.setattr("edge_agent.runtime.onnxruntime_backend.frames_tensor", tensor)
    else:

        def into(frames: Frame, spec: ImageInput, out: Frame, to_rgb: bool = False) -> None:
            fit_frames_into(frames, spec, out, to_rgb)
            seen.append(out.copy())

        monkeypatch.setattr("edge_agent.runtime.openvino_backend.fit_frames_into", into)
    return seen


def _check_input(seen: Seen, backend: str, want: Frame, spec: ImageInput) -> None:
    # The last: a pipeline warms its model up on a black frame first.
    if backend == "onnxruntime":
        np.testing.assert_allclose(seen[-1], _normalised(want, spec), atol=1e-4)
    else:
        assert np.array_equal(seen[-1], want[None])


Reference = tuple[ImageInput, Frame, npt.NDArray[np.float32]]


@pytest.fixture(scope="module")
def reference(resolve: Callable[[str], ResolvedModel]) -> Reference:
    """The model's input spec, the page fitted once by hand, the bare model's scores for it."""
    resolved = resolve("text-orientation")
    spec = resolved.manifest.input
    assert isinstance(spec, ImageInput)
    assert spec.center_crop == 0.875
    want = _fitted_once(_page(), spec)
    session = ort.InferenceSession(str(resolved.path), providers=["CPUExecutionProvider"])
    (scores,) = session.run(["fetch_name_0"], {spec.name: _normalised(want, spec)})
    return spec, want, np.asarray(scores, dtype=np.float32)[0]


def _scores(results: list[Any]) -> npt.NDArray[np.float64]:
    by_label = {r.label: r.score for r in results if isinstance(r, Classification)}
    return np.asarray([by_label[label] for label in ("0", "90", "180", "270")])


@pytest.mark.parametrize("backend", ["onnxruntime", "openvino"])
def test_infer_crops_text_orientation_once(
    compiled: CompileFn,
    reference: Reference,
    monkeypatch: pytest.MonkeyPatch,
    backend: str,
) -> None:
    model, resolved = compiled("text-orientation", backend, precision="f32")
    spec, want, scores = reference
    seen = _watch(monkeypatch, backend)
    results = infer_frame(model, resolved.manifest, _page())
    _check_input(seen, backend, want, spec)
    np.testing.assert_allclose(_scores(results), scores, atol=1e-4)


@pytest.mark.parametrize("backend", ["onnxruntime", "openvino"])
def test_a_pipeline_crops_text_orientation_once(
    catalog: Catalog,
    tmp_path: Path,
    reference: Reference,
    monkeypatch: pytest.MonkeyPatch,
    backend: str,
) -> None:
    folder = tmp_path / "scans"
    folder.mkdir()
    assert cv2.imwrite(str(folder / "page.png"), _page())  # lossless: the same pixels back
    spec = PipelineSpec(
        id="scans",
        model=ModelRef(name="text-orientation", backend=backend, precision="f32"),
        source=FolderSourceSpec(path=folder, reduced_decode=False),
        sinks=[],
    )
    seen = _watch(monkeypatch, backend)
    results: list[FrameResult] = []
    handle = PipelineHandle(spec, ModelPool(catalog), extra_sinks=[CallbackSink(results.append)])
    try:
        handle.run()
    finally:
        handle.close()
    image, want, scores = reference
    _check_input(seen, backend, want, image)
    (frame,) = [r for r in results if r.frame >= 0]
    np.testing.assert_allclose(_scores(frame.results), scores, atol=1e-4)
