"""Bad input gets one clear line on stderr and a non-zero exit, never a traceback."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from edge_agent.catalog.catalog import ResolvedModel
from tests.cli_kit import edge_agent_cli, one_line_error
from tests.conftest import CompileFn, bgr, sample

pytestmark = pytest.mark.usefixtures("cache_dir")


def edge_agent(
    *args: str, home: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **(env or {})}
    if home is not None:
        env["HOME"] = str(home)
    return edge_agent_cli(*args, env=env)


@pytest.fixture(scope="module")
def face(compiled: CompileFn) -> ResolvedModel:
    return compiled("face-blazeface")[1]


@pytest.fixture(scope="module")
def photo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import cv2

    path = tmp_path_factory.mktemp("img") / "astronaut.jpg"
    cv2.imwrite(str(path), bgr(sample("astronaut")))
    return path


def test_missing_input_file(photo: Path) -> None:
    proc = edge_agent(
        "infer", "--model", "face-blazeface", "--input", str(photo.parent / "nope.jpg")
    )
    one_line_error(proc, "does not exist", "nope.jpg")


def test_unreadable_image(tmp_path: Path) -> None:
    bad = tmp_path / "broken.jpg"
    bad.write_bytes(b"\xff\xd8\xff\xe0 this is not really a jpeg")
    proc = edge_agent("infer", "--model", "face-blazeface", "--input", str(bad))
    one_line_error(proc, "cannot decode image")


def test_unknown_model_name(photo: Path) -> None:
    proc = edge_agent("infer", "--model", "yolov99", "--input", str(photo))
    one_line_error(proc, "unknown model 'yolov99'", "person-ssdlite")


def test_unknown_device(photo: Path) -> None:
    proc = edge_agent(
        "infer", "--model", "face-blazeface", "--input", str(photo), "--device", "TPU"
    )
    one_line_error(proc, "unknown device 'TPU'", "AUTO")


@pytest.mark.parametrize("cut", [0.5, 0.0])
def test_corrupt_or_truncated_model(
    face: ResolvedModel, photo: Path, tmp_path: Path, cut: float
) -> None:
    data = face.path.read_bytes()
    model = tmp_path / "face.tflite"
    model.write_bytes(data[: int(len(data) * cut)] if cut else b"\x00garbage" * 64)
    # A manifest beside it, minus the pinned source: a local model under test.
    manifest = (Path(__file__).parents[2] / "models" / "face-blazeface.toml").read_text()
    body = manifest.split("[source]")[0] + "[input]" + manifest.split("[input]")[1]
    model.with_suffix(".toml").write_text(body)
    proc = edge_agent("infer", "--model", str(model), "--input", str(photo), "--no-cache")
    one_line_error(proc, "cannot read model", "corrupt")


def test_model_without_manifest(face: ResolvedModel, photo: Path, tmp_path: Path) -> None:
    model = tmp_path / "face.tflite"
    shutil.copy(face.path, model)
    proc = edge_agent("infer", "--model", str(model), "--input", str(photo))
    one_line_error(proc, "no manifest")


def test_wrong_input_shape() -> None:
    proc = edge_agent("bench", "--model", "text-det-ppocr", "--shape", "1,3,640", "--time", "0.2")
    one_line_error(proc, "does not fit")
    proc = edge_agent("bench", "--model", "text-det-ppocr", "--shape", "1,x,640,640")
    one_line_error(proc, "bad shape")


def test_audio_model_given_an_image(photo: Path) -> None:
    proc = edge_agent("infer", "--model", "vad-silero", "--input", str(photo))
    one_line_error(proc, "takes audio")


def test_onnxruntime_cannot_read_tf(photo: Path) -> None:
    proc = edge_agent(
        "infer", "--model", "person-ssdlite", "--backend", "onnxruntime", "--input", str(photo)
    )
    # The fix names the spec's field too: an agent answers with the same words, and it has
    # no --backend flag.
    one_line_error(
        proc, "ONNX Runtime cannot read", "--backend openvino", 'backend = "openvino" in a pipeline'
    )


def test_broken_wav(tmp_path: Path) -> None:
    bad = tmp_path / "broken.wav"
    bad.write_bytes(b"RIFF\x10\x00\x00\x00WAVEfmt ")
    proc = edge_agent("infer", "--model", "vad-silero", "--input", str(bad))
    one_line_error(proc, "cannot read")


def test_infer_prints_json_lines_and_reports_device(photo: Path, tmp_path: Path) -> None:
    proc = edge_agent(
        "infer",
        "--model",
        "face-blazeface",
        "--input",
        str(photo),
        "--device",
        "GPU",
        home=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    results = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["label"] for r in results] == ["face"]
    compile_info = json.loads(proc.stderr.splitlines()[-1])["compile"]
    assert compile_info["device"] == "CPU"
    assert compile_info["fallbacks"][0]["device"] == "GPU"
    # No phone-home: the OpenVINO telemetry consent is recorded as declined.
    assert (tmp_path / "intel" / "openvino_telemetry").read_text() == "0"


def test_bench_json_has_the_figures() -> None:
    proc = edge_agent("bench", "--model", "face-blazeface", "--time", "1", "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["throughput_fps"] > 0
    assert result["iterations"] > 10
    assert set(result["latency_ms"]) >= {"p50", "p95", "p99"}
    assert result["latency_ms"]["p50"] <= result["latency_ms"]["p99"]
    assert result["compile"]["precision"] in {"f32", "bf16", "f16"}
    assert result["first_inference_ms"] > 0


def test_bench_onnxruntime_dynamic_model_default_shape() -> None:
    proc = edge_agent(
        "bench", "--model", "text-det-ppocr", "--backend", "onnxruntime", "--time", "1", "--json"
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["compile"]["model_shape"] == [1, 3, 640, 640]
    assert result["iterations"] >= 1


def test_doctor_lists_cpu() -> None:
    proc = edge_agent("doctor", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["openvino"]
    assert any(d["name"] == "CPU" for d in report["devices"])
    assert "CPUExecutionProvider" in report["onnxruntime_providers"]


def test_doctor_with_a_config_checks_the_services_folders(tmp_path: Path) -> None:
    # Run by hand on an installed box it checked the caller's own folders (root's
    # ~/.cache), never the ones the service writes. The config's own folder wins, then the
    # unit's; this shell's $EDGE_AGENT_CACHE (set by the suite) is not the service's.
    config = tmp_path / "agent.toml"
    config.write_text(
        f'device_id = "dock-7"\nstate_dir = "{tmp_path / "state"}"\n'
        '[mqtt]\nhost = "broker.plant.lan"\npassword_credential = "mqtt-password"\n'
    )
    proc = edge_agent("doctor", "--json", "--config", str(config))
    report = json.loads(proc.stdout)
    assert report["state_dir"] == str(tmp_path / "state")
    assert report["cache_dir"] == "/var/cache/edge-agent"
    # The password is the agent's business (no $CREDENTIALS_DIRECTORY here): not read.
    assert "CREDENTIALS_DIRECTORY" not in proc.stderr


def test_models_list_and_info() -> None:
    proc = edge_agent("models", "list")
    assert proc.returncode == 0, proc.stderr
    for name in (
        "person-ssdlite",
        "face-blazeface",
        "text-orientation",
        "text-det-ppocr",
        "vad-silero",
    ):
        assert name in proc.stdout
    info = json.loads(edge_agent("models", "info", "vad-silero").stdout)
    assert info["manifest"]["head"]["type"] == "vad"
    assert info["fetched"] is True
    assert Path(info["path"]).is_file()


def test_models_info_takes_a_model_file_with_its_manifest(tmp_path: Path) -> None:
    # A calibrated model is a file with its manifest beside it; `bench --model` takes one,
    # and so must `models info` (tools/bench_runtime.py asks it where the file is).
    reference = json.loads(edge_agent("models", "info", "vad-silero").stdout)
    model = tmp_path / "model.onnx"
    shutil.copyfile(reference["path"], model)
    shutil.copyfile(
        Path(__file__).parents[2] / "models" / "vad-silero.toml", tmp_path / "model.toml"
    )
    info = json.loads(edge_agent("models", "info", str(model)).stdout)
    assert info["path"] == str(model)
    assert info["manifest"]["head"]["type"] == "vad"
    assert info["fetched"] is True
    missing = edge_agent("models", "info", str(tmp_path / "other.onnx"))
    assert one_line_error(missing, "does not exist") == "model.not_found"


@pytest.mark.parametrize("seconds", ["0", "-1", "nan", "soon"])
def test_bench_time_must_be_positive(seconds: str) -> None:
    proc = edge_agent("bench", "--model", "text-orientation", "--time", seconds)
    assert one_line_error(proc, "--time") == "input.invalid"


def spec_file(folder: Path, body: str = "", source: Path | None = None) -> Path:
    path = folder / "spec.toml"
    path.write_text(
        f'id = "dock"\n{body}\n[model]\nname = "text-orientation"\n'
        f'[source]\ntype = "folder"\npath = "{source or folder}"\n'
    )
    return path


@pytest.mark.parametrize("count", ["0", "-1"])
def test_max_frames_must_be_positive(photo: Path, tmp_path: Path, count: str) -> None:
    by_flags = edge_agent(
        "run-pipeline", "--model", "text-orientation", "--source", str(photo.parent),
        "--max-frames", count,
    )  # fmt: skip
    one_line_error(by_flags, "--max-frames")
    # With a spec the same value used to run 0 frames and exit 0.
    with_spec = edge_agent(
        "run-pipeline", str(spec_file(tmp_path, source=photo.parent)), "--max-frames", count
    )
    one_line_error(with_spec, "--max-frames")
    in_spec = edge_agent("run-pipeline", str(spec_file(tmp_path, f"max_frames = {count}")))
    assert one_line_error(in_spec, "max_frames") == "config.invalid"


def test_unwritable_cache_is_one_line_and_doctor_fails(photo: Path, tmp_path: Path) -> None:
    # Under a regular file: no folder can be made there, whoever runs the test (root too).
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    env = {"EDGE_AGENT_CACHE": str(blocker / "cache")}
    proc = edge_agent("infer", "--model", "text-orientation", "--input", str(photo), env=env)
    assert one_line_error(proc, "not writable", str(blocker)) == "path.unwritable"
    doctor = edge_agent("doctor", "--json", env=env)
    report = json.loads(doctor.stdout)
    assert report["cache_writable"] is False
    assert report["state_writable"] is True
    assert one_line_error(doctor, "cache folder", "not writable") == "path.unwritable"
    state = edge_agent("--state-dir", str(blocker / "state"), "doctor")
    one_line_error(state, "state folder", "not writable")


def test_output_paths_are_checked_before_any_work(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    # The model does not exist: an output error first proves nothing was loaded before it.
    for sink in (
        f'sinks = [{{type = "jsonl", path = "{blocker}/out.jsonl"}}]',
        f'sinks = [{{type = "snapshot", folder = "{blocker}/shots"}}]',
        f'sinks = [{{type = "capture", folder = "{blocker}/frames"}}]',
    ):
        spec = spec_file(tmp_path, sink).read_text().replace("text-orientation", "no-such-model")
        (tmp_path / "spec.toml").write_text(spec)
        proc = edge_agent("run-pipeline", str(tmp_path / "spec.toml"))
        assert one_line_error(proc, "not writable", str(blocker)) == "path.unwritable"


def test_infer_on_a_folder_says_it_is_a_folder(photo: Path) -> None:
    proc = edge_agent("infer", "--model", "text-orientation", "--input", str(photo.parent))
    one_line_error(proc, "is a folder", "run-pipeline")


def test_usage_errors_are_one_line_too() -> None:
    one_line_error(edge_agent("bench"), "--model")
    one_line_error(edge_agent("run-pipeline", "--hint", "fast"), "--hint")
    one_line_error(edge_agent("run-pipeline"), "nothing to run", "--source")


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("rtsp://admin:secret@cam.local:55x4/stream", "'55x4'"),
        ("rtsp://admin:secret@[fe80::1/stream", "Invalid IPv6 URL"),
        ("rtsp://:554/stream", "no host"),
        # Passed, and crashed the reader thread (a UnicodeError) at its first connect.
        ("rtsp://admin:secret@cam..local/stream", "not a valid name"),
    ],
)
def test_a_malformed_stream_url_is_one_line_without_the_password(
    tmp_path: Path, url: str, needle: str
) -> None:
    # It validated, then the source's first log of the URL raised ValueError: a traceback.
    by_flag = edge_agent("run-pipeline", "--model", "person-ssdlite", "--source", url)
    assert one_line_error(by_flag, "--source", "stream url", needle) == "input.invalid"
    spec = tmp_path / "spec.toml"
    spec.write_text(
        f'id = "dock"\n[model]\nname = "person-ssdlite"\n[source]\ntype = "stream"\nurl = "{url}"\n'
    )
    in_spec = edge_agent("run-pipeline", str(spec))
    assert one_line_error(in_spec, "source.stream.url", needle) == "config.invalid"
    assert "secret" not in by_flag.stderr + in_spec.stderr


@pytest.mark.parametrize("mode", ["tiles", "regions"])
def test_tiles_and_regions_refuse_a_head_that_is_not_a_detector(
    photo: Path, tmp_path: Path, mode: str
) -> None:
    # A classifier ran once per tile: fifteen classifications of one frame, unmerged.
    spec = spec_file(tmp_path, f'[detect]\nmode = "{mode}"', source=photo.parent)
    proc = edge_agent("run-pipeline", str(spec), "--max-frames", "1")
    code = one_line_error(proc, "classification head", f'mode "{mode}"', 'mode = "frame"')
    assert code == "model.incompatible"


def test_calibrate_refuses_a_device_and_a_metric_before_reading_the_data(
    tmp_path: Path,
) -> None:
    # The data was read first: minutes on a real capture, only to be told the device name
    # is a typo or the recipe cannot judge this model. A folder of one corrupt frame makes
    # the order visible: read first, it is the data that is refused.
    capture = tmp_path / "capture"
    capture.mkdir()
    (capture / "frame.jpg").write_bytes(b"not a jpeg")
    common = ("calibrate", "--model", "person-ssdlite", "--data", str(capture))
    proc = edge_agent(*common, "--device", "TPU", "--out", str(tmp_path / "a"))
    assert one_line_error(proc, "unknown device 'TPU'") == "device.invalid"
    recipe = tmp_path / "recipe.toml"
    recipe.write_text('metric = "top1-agreement"\n')
    proc = edge_agent(*common, "--recipe", str(recipe), "--out", str(tmp_path / "b"))
    assert one_line_error(proc, "top1-agreement", "detection-f1") == "config.invalid"
    assert not (tmp_path / "a").exists()
    assert not (tmp_path / "b").exists()
