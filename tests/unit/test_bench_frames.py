"""The benchmark's frames need no resize, so a benchmark measures the model, not cv2.resize.

A centre-cropped classifier fed a frame at its own size crops it to 87.5% and scales it
back up on every request; the frame the benchmark builds must be the one whose centred
square is the model's input already.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from edge_agent.bench import fitted_frame_size
from edge_agent.catalog.catalog import default_models_dir
from edge_agent.catalog.manifest import ImageInput, load_manifest
from edge_agent.runtime.preprocess import center_crop, fit_frame, input_geometry


def _image(side: int, crop: float) -> ImageInput:
    return ImageInput(
        name="x",
        shape=(1, 3, side, side),
        layout="NCHW",
        element_type="f32",
        color="BGR",
        center_crop=crop,
    )


def test_text_orientation_gets_the_frame_its_crop_was_made_for() -> None:
    manifest = load_manifest(default_models_dir() / "text-orientation.toml")
    spec = manifest.input
    assert isinstance(spec, ImageInput)
    assert spec.center_crop < 1
    assert fitted_frame_size(spec) == (256, 256)
    frame = np.random.default_rng(1).integers(0, 256, (256, 256, 3), dtype=np.uint8)
    # Exactly the centred pixels: no interpolation touched them.
    assert np.array_equal(fit_frame(frame, spec), center_crop(frame, spec.center_crop))


def test_uncropped_models_get_their_own_size() -> None:
    for name in ("person-ssdlite", "text-det-ppocr", "face-blazeface"):
        spec = load_manifest(default_models_dir() / f"{name}.toml").input
        assert isinstance(spec, ImageInput)
        assert fitted_frame_size(spec) == (spec.height, spec.width)


@given(side=st.integers(8, 1024), crop=st.floats(0.3, 0.999))
def test_the_fitted_frame_needs_no_resize_whenever_one_exists(side: int, crop: float) -> None:
    spec = _image(side, crop)
    height, width = fitted_frame_size(spec)
    geometry = input_geometry(spec, (width, height))
    x0, y0, x1, y1 = geometry.source
    exists = any(round(s * crop) == side for s in range(1, 2 * round(side / crop) + 2))
    assert ((x1 - x0, y1 - y0) == (side, side)) == exists
