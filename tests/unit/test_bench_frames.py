"""The benchmark feeds what the pipelines feed: frames already at the model's input size.

A centre-cropped classifier takes such a frame as its input as it is (the pipelines fit
whole frames on the host), so the benchmark measures the engine's path the pipelines use,
with no crop or resize in it.
"""

from __future__ import annotations

import numpy as np

from edge_agent.bench import bench_inputs
from edge_agent.catalog.catalog import default_models_dir
from edge_agent.catalog.manifest import ImageInput, load_manifest
from edge_agent.runtime.base import CompileReport
from edge_agent.runtime.preprocess import fit_frame


def _report(spec: ImageInput, batch: int) -> CompileReport:
    shape = (batch, *spec.shape[1:])
    return CompileReport(
        backend="onnxruntime",
        requested="CPU",
        device="CPU",
        precision="f32",
        hint="throughput",
        requests=1,
        compile_s=0.0,
        from_cache=False,
        model_shape=shape,
        inputs={spec.name: (batch, spec.height, spec.width, 3)},
    )


def test_text_orientation_is_benchmarked_on_frames_at_its_size() -> None:
    manifest = load_manifest(default_models_dir() / "text-orientation.toml")
    spec = manifest.input
    assert isinstance(spec, ImageInput)
    assert spec.center_crop < 1
    frames = bench_inputs(manifest, _report(spec, 2))[spec.name]
    assert frames.shape == (2, 224, 224, 3)
    # The engine takes them as they are: no crop to 196 and resize back to 224.
    for frame in np.asarray(frames):
        assert np.array_equal(fit_frame(frame, spec), frame)


def test_every_image_model_is_benchmarked_at_its_size() -> None:
    for name in ("person-ssdlite", "text-det-ppocr", "face-blazeface"):
        manifest = load_manifest(default_models_dir() / f"{name}.toml")
        spec = manifest.input
        assert isinstance(spec, ImageInput)
        frames = bench_inputs(manifest, _report(spec, 1))[spec.name]
        assert np.shape(frames) == (1, spec.height, spec.width, 3)
