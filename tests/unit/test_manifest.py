"""Manifests are strict, and the catalog finds models by name or by path."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from edge_agent.catalog.catalog import Catalog, default_models_dir
from edge_agent.catalog.manifest import AudioInput, ImageInput, Manifest, load_manifest
from edge_agent.config_files import RECORDED
from edge_agent.errors import EdgeAgentError
from edge_agent.infer import read_input

MODELS = default_models_dir()
FACE_TOML = MODELS / "face-blazeface.toml"
ORIENTATION_TOML = MODELS / "text-orientation.toml"


def _data(path: Path) -> dict[str, Any]:
    return tomllib.loads(path.read_text(encoding="utf-8"))


def _image(**changes: object) -> ImageInput:
    base: dict[str, object] = {
        "name": "x",
        "shape": (1, 3, 224, 320),
        "layout": "NCHW",
        "element_type": "f32",
        "color": "BGR",
    }
    return ImageInput.model_validate({**base, **changes})


@pytest.mark.parametrize("path", sorted(MODELS.glob("*.toml")), ids=lambda p: p.stem)
def test_every_reference_manifest_loads(path: Path) -> None:
    manifest = load_manifest(path)
    assert manifest.name == path.stem, "the file is named after the model"
    assert manifest.source is not None, "reference models are fetched from a pinned wheel"


def test_the_reference_set_is_not_empty() -> None:
    assert len(list(MODELS.glob("*.toml"))) >= 5


@pytest.mark.parametrize(
    ("section", "where"),
    [
        ("", "bogus"),
        ("[input]\n", "input.image.bogus"),
        ("[head]\n", "head.blazeface.bogus"),
        ("[source]\n", "source.bogus"),
    ],
)
def test_unknown_key_anywhere_is_rejected_naming_where(
    tmp_path: Path, section: str, where: str
) -> None:
    text = FACE_TOML.read_text(encoding="utf-8")
    if section:
        assert section in text
        text = text.replace(section, section + "bogus = 1\n", 1)
    else:
        text = "bogus = 1\n" + text
    path = tmp_path / "face.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(EdgeAgentError) as info:
        load_manifest(path)
    assert f"invalid at {where}:" in info.value.problem
    assert str(path) in info.value.problem
    assert info.value.fix.startswith("fix the manifest")


def test_typo_in_a_known_key_is_an_unknown_key(tmp_path: Path) -> None:
    text = FACE_TOML.read_text(encoding="utf-8").replace("scale = [", "scales = [", 1)
    path = tmp_path / "face.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(EdgeAgentError, match=r"invalid at input\.image\.scales"):
        load_manifest(path)


@pytest.mark.parametrize("field", ["sha256", "wheel_sha256"])
@pytest.mark.parametrize(
    "bad",
    [
        "3BC182EB9F33925D9E58B5C8D59308A760F4ADEA8F282370E428C51212C26633",  # upper case
        "3bc182eb9f33925d9e58b5c8d59308a760f4adea8f282370e428c51212c2663",  # 63 digits
        "3bc182eb9f33925d9e58b5c8d59308a760f4adea8f282370e428c51212c266330",  # 65 digits
        "zbc182eb9f33925d9e58b5c8d59308a760f4adea8f282370e428c51212c26633",  # not hex
        "",
    ],
)
def test_bad_sha256_is_rejected(field: str, bad: str) -> None:
    data = _data(FACE_TOML)
    data["source"][field] = bad
    with pytest.raises(ValueError, match=field):
        Manifest.model_validate(data)


def test_bad_sha256_in_a_file_names_the_field(tmp_path: Path) -> None:
    good = _data(FACE_TOML)["source"]["sha256"]
    text = FACE_TOML.read_text(encoding="utf-8").replace(good, good.upper())
    path = tmp_path / "face.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(EdgeAgentError, match=r"invalid at source\.sha256"):
        load_manifest(path)


def test_missing_and_unreadable_manifests(tmp_path: Path) -> None:
    with pytest.raises(EdgeAgentError, match="does not exist"):
        load_manifest(tmp_path / "absent.toml")
    broken = tmp_path / "broken.toml"
    broken.write_text("name = \n", encoding="utf-8")
    with pytest.raises(EdgeAgentError, match="unreadable"):
        load_manifest(broken)


def test_height_and_width_follow_the_layout() -> None:
    nchw = _image(shape=(1, 3, 224, 320), layout="NCHW")
    nhwc = _image(shape=(1, 224, 320, 3), layout="NHWC")
    assert (nchw.height, nchw.width) == (224, 320)
    assert (nhwc.height, nhwc.width) == (224, 320)


def test_with_shape_none_keeps_the_spec() -> None:
    spec = _image()
    assert spec.with_shape(None) is spec


@pytest.mark.parametrize(
    ("layout", "old", "new", "size"),
    [
        ("NCHW", (1, 3, 224, 320), (1, 3, 480, 640), (480, 640)),
        ("NHWC", (1, 128, 128, 3), (1, 256, 192, 3), (256, 192)),
    ],
)
def test_with_shape_accepts_a_new_size(
    layout: str, old: tuple[int, ...], new: tuple[int, ...], size: tuple[int, int]
) -> None:
    spec = _image(layout=layout, shape=old)
    reshaped = spec.with_shape(new)
    assert reshaped.shape == new
    assert (reshaped.height, reshaped.width) == size
    assert reshaped.layout == layout
    assert spec.shape == old, "the original spec is unchanged"


@pytest.mark.parametrize(
    ("layout", "old", "bad"),
    [
        ("NCHW", (1, 3, 224, 224), (1, 3, 224)),  # rank 3
        ("NCHW", (1, 3, 224, 224), (1, 3, 224, 224, 1)),  # rank 5
        ("NCHW", (1, 3, 224, 224), (1, 1, 224, 224)),  # grey
        ("NCHW", (1, 3, 224, 224), (1, 224, 224, 3)),  # NHWC order for an NCHW model
        ("NHWC", (1, 128, 128, 3), (1, 3, 128, 128)),  # NCHW order for an NHWC model
        ("NHWC", (1, 128, 128, 3), (1, 128, 128, 4)),  # RGBA
    ],
)
def test_with_shape_rejects_wrong_rank_or_channels(
    layout: str, old: tuple[int, ...], bad: tuple[int, ...]
) -> None:
    spec = _image(layout=layout, shape=old)
    with pytest.raises(EdgeAgentError, match="does not fit") as info:
        spec.with_shape(bad)
    assert layout in info.value.fix


def test_unknown_name_lists_the_known_names(tmp_path: Path) -> None:
    catalog = Catalog(MODELS, tmp_path)
    with pytest.raises(EdgeAgentError, match="unknown model 'no-such-model'") as info:
        catalog.resolve("no-such-model")
    for name in ("face-blazeface", "person-ssdlite", "text-orientation"):
        assert name in info.value.fix
    assert not any(tmp_path.iterdir()), "nothing is fetched for an unknown name"


def test_unknown_name_in_an_empty_catalog(tmp_path: Path) -> None:
    empty = tmp_path / "models"
    empty.mkdir()
    with pytest.raises(EdgeAgentError, match="unknown model") as info:
        Catalog(empty, tmp_path / "cache").resolve("face-blazeface")
    assert "none" in info.value.fix


def test_path_with_a_sidecar_manifest_resolves_without_fetching(tmp_path: Path) -> None:
    model = tmp_path / "mine" / "orient.onnx"
    model.parent.mkdir()
    model.write_bytes(b"not really onnx; resolve must not read it")
    model.with_suffix(".toml").write_text(
        ORIENTATION_TOML.read_text(encoding="utf-8"), encoding="utf-8"
    )
    cache = tmp_path / "cache"
    resolved = Catalog(MODELS, cache).resolve(str(model))
    assert resolved.path == model
    assert resolved.manifest == load_manifest(ORIENTATION_TOML)
    assert not cache.exists(), "a local file with a manifest is never fetched"


def test_sidecar_manifest_is_validated(tmp_path: Path) -> None:
    model = tmp_path / "orient.onnx"
    model.write_bytes(b"x")
    model.with_suffix(".toml").write_text("name = 'orient'\n", encoding="utf-8")
    with pytest.raises(EdgeAgentError, match="invalid at"):
        Catalog(MODELS, tmp_path / "cache").resolve(str(model))


@pytest.mark.parametrize("filename", ["model.onnx", "model.xml", "model.tflite", "model.pb"])
def test_path_without_a_manifest_says_so(tmp_path: Path, filename: str) -> None:
    model = tmp_path / filename
    model.write_bytes(b"x")
    with pytest.raises(EdgeAgentError, match=r"no manifest beside it \(model\.toml\)"):
        Catalog(MODELS, tmp_path / "cache").resolve(str(model))


def test_path_of_an_unknown_format_without_a_manifest(tmp_path: Path) -> None:
    model = tmp_path / "model.bin"
    model.write_bytes(b"x")
    with pytest.raises(EdgeAgentError, match=r"unknown model format '\.bin'"):
        Catalog(MODELS, tmp_path / "cache").resolve(str(model))


@pytest.mark.parametrize("filename", ["absent.onnx", "sub/absent", "ABSENT.ONNX"])
def test_nonexistent_path_errors(tmp_path: Path, filename: str) -> None:
    with pytest.raises(EdgeAgentError, match="does not exist"):
        Catalog(MODELS, tmp_path / "cache").resolve(str(tmp_path / filename))


def test_bare_file_name_with_a_model_suffix_is_a_path(tmp_path: Path) -> None:
    # "face-blazeface.onnx" is not a catalog name even though "face-blazeface" is.
    with pytest.raises(EdgeAgentError, match="does not exist"):
        Catalog(MODELS, tmp_path / "cache").resolve("face-blazeface.onnx")


VAD_TOML = MODELS / "vad-silero.toml"


@pytest.mark.parametrize(
    ("source", "old", "new", "where", "says"),
    [
        # An image model claiming to be a VAD: `infer` would read a WAV for it.
        (ORIENTATION_TOML, 'task = "classification"', 'task = "vad"', "input", "audio input"),
        (VAD_TOML, 'task = "vad"', 'task = "detection"', "input", "image input"),
        # A head that cannot decode the task's outputs.
        (ORIENTATION_TOML, 'task = "classification"', 'task = "detection"', "head", "ssd"),
        (FACE_TOML, 'task = "detection"', 'task = "text-detection"', "head", "dbnet"),
        (FACE_TOML, 'task = "detection"', 'task = "raw"', "head", "raw"),
    ],
)
def test_task_must_agree_with_input_and_head(
    tmp_path: Path, source: Path, old: str, new: str, where: str, says: str
) -> None:
    text = source.read_text(encoding="utf-8")
    assert old in text
    path = tmp_path / "model.toml"
    path.write_text(text.replace(old, new, 1), encoding="utf-8")
    with pytest.raises(EdgeAgentError, match=rf"invalid at {where}:.*{says}"):
        load_manifest(path)


def test_a_raw_head_fits_any_image_task() -> None:
    data = _data(ORIENTATION_TOML)
    data["head"] = {"type": "raw"}
    assert Manifest.model_validate(data).head.type == "raw"


def test_task_selects_how_infer_reads_its_input(tmp_path: Path) -> None:
    image = tmp_path / "page.png"
    image.write_bytes(b"not read")
    vad = load_manifest(VAD_TOML)
    with pytest.raises(EdgeAgentError, match="takes audio") as info:
        read_input(vad, image)
    assert info.value.code == "input.invalid"
    orientation = load_manifest(ORIENTATION_TOML)
    with pytest.raises(EdgeAgentError, match="takes images") as info:
        read_input(orientation, tmp_path / "clip.wav")
    assert info.value.code == "input.invalid"


def test_a_folder_as_input_is_named_as_a_folder(tmp_path: Path) -> None:
    with pytest.raises(EdgeAgentError, match="is a folder, not a file") as info:
        read_input(load_manifest(ORIENTATION_TOML), tmp_path)
    assert info.value.fix
    with pytest.raises(EdgeAgentError, match="does not exist") as info:
        read_input(load_manifest(ORIENTATION_TOML), tmp_path / "absent.png")
    assert info.value.code == "input.not_found"


@pytest.mark.parametrize("rate", [1, 999, 384_001, 4_000_000_000])
def test_an_audio_model_rate_no_wav_reader_takes_is_refused(tmp_path: Path, rate: int) -> None:
    # A rate above 0 was enough; the resampler then refused it mid-run, as a traceback.
    text = (Path(default_models_dir()) / "vad-silero.toml").read_text()
    path = tmp_path / "vad.toml"
    path.write_text(text.replace("sample_rate = 16000", f"sample_rate = {rate}"))
    with pytest.raises(EdgeAgentError, match=r"invalid at input\.audio\.sample_rate"):
        load_manifest(path)


def _vad_without_head_rate(tmp_path: Path, *changes: tuple[str, str]) -> Path:
    """vad-silero's manifest as a custom one is written: the head's rate left to its default."""
    text = VAD_TOML.read_text(encoding="utf-8")
    head = text.index("[head]")
    text = text[:head] + text[head:].replace("sample_rate = 16000\n", "", 1)
    for old, new in changes:
        assert old in text
        text = text.replace(old, new, 1)
    path = tmp_path / "vad.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_a_vad_whose_input_and_head_disagree_is_refused_naming_both(tmp_path: Path) -> None:
    # `infer` and calibration read audio at the input's rate, the pipeline at the head's:
    # an 8 kHz model ran on 16 kHz audio in one of them, and the manifest validated.
    assert load_manifest(_vad_without_head_rate(tmp_path)).input == AudioInput(
        name="input", sample_rate=16000
    )
    eight_k = _vad_without_head_rate(tmp_path, ("sample_rate = 16000", "sample_rate = 8000"))
    with pytest.raises(
        EdgeAgentError, match=r"input\.sample_rate \(8000\) and head\.sample_rate \(16000\)"
    ) as caught:
        load_manifest(eight_k)
    assert caught.value.code == "config.invalid"
    renamed = _vad_without_head_rate(tmp_path, ('name = "input"', 'name = "audio"'))
    with pytest.raises(
        EdgeAgentError, match=r"input\.name \('audio'\) and head\.audio_input \('input'\)"
    ):
        load_manifest(renamed)


def test_a_vad_context_longer_than_its_window_is_refused(tmp_path: Path) -> None:
    # The pipeline carries context from the last window alone: its inputs came out shorter
    # than `infer`'s and than the model's static [1, 576].
    path = _vad_without_head_rate(tmp_path, ("context = 64", "context = 600"))
    with pytest.raises(EdgeAgentError, match=r"head.*context \(600\) is more than its window"):
        load_manifest(path)


def test_a_stored_release_keeps_a_vad_manifest_an_earlier_build_accepted(tmp_path: Path) -> None:
    # Stored by an earlier build, such a release served (the pipeline reads the head
    # alone); refused as it is read back, its version became damaged after the upgrade.
    for change in (('name = "input"', 'name = "audio"'), ("context = 64", "context = 600")):
        data = tomllib.loads(_vad_without_head_rate(tmp_path, change).read_text())
        manifest = Manifest.model_validate(data, context={RECORDED: True})
        assert manifest.task == "vad"
        with pytest.raises(ValueError, match=r"disagree|more than its window"):
            Manifest.model_validate(data)
