"""Inputs a new user met that used to end in a traceback, a long wait or invalid JSON.

Each is one `error: problem; fix [code]` line and exit 2, checked in a child process as a
user runs the command: broker flags and URLs, TLS files, unwritable key paths, a missing
models folder, and manifests that do not fit their model.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import cv2
import numpy as np
import pytest

from edge_agent.comms.local_broker import free_port
from edge_agent.comms.session import connect
from edge_agent.comms.settings import BrokerSettings
from edge_agent.errors import EdgeAgentError
from tests.cli_kit import edge_agent_cli, one_line_error, run_bounded
from tests.conftest import bgr, sample

FLEET = [sys.executable, "-m", "edge_agent.fleet.cli"]
MODELS = Path(__file__).parents[2] / "models"

pytestmark = pytest.mark.usefixtures("cache_dir")


def fleet(*args: str) -> subprocess.CompletedProcess[str]:
    return run_bounded([*FLEET, *args], timeout=60)


def closed_port() -> int:
    # Nothing listens there, and it is outside the ephemeral range, so no connection of
    # this machine's (nor the client's own, connecting to itself) can hold it meanwhile.
    return free_port()


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--broker", "mqtt://127.0.0.1:99999"], "is not mqtt://host"),
        (["--broker", "mqtt://127.0.0.1:abc"], "is not mqtt://host"),
        (["--broker", "mqtt://[::1"], "is not mqtt://host"),
        (["-p", "99999"], "port is invalid"),
        (["-p", "0"], "port is invalid"),
        (["--password-file", "/nonexistent/pw"], "cannot read the password file"),
        (["--cafile", "/nonexistent/ca.pem"], "--cafile /nonexistent/ca.pem"),
    ],
)
def test_bad_broker_flags_are_refused_before_connecting(flags: list[str], needle: str) -> None:
    # The needle is the flag's own error: a connect attempt would say broker.unreachable.
    proc = fleet("cmd", "dock-7", "ping", *flags)
    assert one_line_error(proc, needle, prog="edge-fleet") == "input.invalid"


def test_a_ca_file_that_is_not_pem_is_one_line(tmp_path: Path) -> None:
    junk = tmp_path / "ca.pem"
    junk.write_text("not a certificate\n")
    proc = fleet("cmd", "dock-7", "ping", "--cafile", str(junk))
    assert one_line_error(proc, "cannot set up TLS", prog="edge-fleet") == "config.invalid"


def test_a_refused_connection_fails_at_once_with_its_cause() -> None:
    proc = fleet("cmd", "dock-7", "ping", "-p", str(closed_port()))
    assert one_line_error(proc, "Connection refused", prog="edge-fleet") == "broker.unreachable"
    # In process, with a timeout no refusal comes near: the answer, not the wait, ends it.
    settings = BrokerSettings(port=closed_port(), reconnect_min_s=0.05)
    started = time.monotonic()
    with pytest.raises(EdgeAgentError) as caught:
        connect(settings, timeout=60)
    assert time.monotonic() - started < 30
    assert "Connection refused" in str(caught.value)
    assert "within" not in str(caught.value)
    # A server waits instead: it may have started before its broker.
    started = time.monotonic()
    with pytest.raises(EdgeAgentError) as caught:
        connect(settings, timeout=1.0, fail_fast=False)
    assert time.monotonic() - started >= 1.0


def test_keygen_into_a_path_that_cannot_exist(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    proc = fleet("keygen", str(blocker / "fleet.key"))
    assert one_line_error(proc, prog="edge-fleet") == "path.unwritable"


def test_models_dir_that_is_not_a_folder() -> None:
    proc = edge_agent_cli("--models-dir", "/nonexistent/models", "models", "list")
    assert one_line_error(proc, "is not a folder") == "input.not_found"


def text_orientation_copy(folder: Path, manifest_edit: tuple[str, str]) -> Path:
    """text-orientation's ONNX file with its manifest beside it, one line of it changed."""
    info = edge_agent_cli("models", "info", "text-orientation")
    assert info.returncode == 0, info.stderr
    model = folder / "model.onnx"
    shutil.copyfile(json.loads(info.stdout)["path"], model)
    text = (MODELS / "text-orientation.toml").read_text()
    old, new = manifest_edit
    assert old in text
    text = text.split("[source]")[0] + "[input]" + text.split("[input]")[1]
    (folder / "model.toml").write_text(text.replace(old, new))
    return model


def on_the_photo(verb: str, model: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`infer` (uncached) or `run-pipeline` of `model` on the astronaut photo."""
    photo = tmp_path / "astronaut.jpg"
    cv2.imwrite(str(photo), bgr(sample("astronaut")))
    flag = "--input" if verb == "infer" else "--source"
    extra = ["--no-cache"] if verb == "infer" else []
    return edge_agent_cli(verb, "--model", str(model), flag, str(photo), *extra)


def test_a_manifest_layout_that_does_not_fit_the_model(tmp_path: Path) -> None:
    model = text_orientation_copy(tmp_path, ('layout = "NCHW"', 'layout = "NHWC"'))
    proc = on_the_photo("infer", model, tmp_path)
    assert one_line_error(proc, "does not fit the model") == "model.shape"


def test_a_manifest_scale_of_zero_is_refused(tmp_path: Path) -> None:
    # It used to print scores of NaN, which is not JSON, and exit 0.
    model = text_orientation_copy(tmp_path, ("scale = [", "scale = [0.0, 0.0, 0.0] # ["))
    proc = edge_agent_cli("models", "info", str(model))
    assert one_line_error(proc, "scale") == "config.invalid"


@pytest.mark.parametrize("verb", ["infer", "run-pipeline"])
def test_a_head_naming_an_output_the_model_lacks_is_one_line(tmp_path: Path, verb: str) -> None:
    # infer printed its compile line before the error; run-pipeline warned on every frame
    # and exited 0. Both now decode one run before anything else is said.
    model = text_orientation_copy(tmp_path, ('output = "fetch_name_0"', 'output = "logits"'))
    proc = on_the_photo(verb, model, tmp_path)
    code = one_line_error(proc, "no output 'logits'", "fetch_name_0")
    assert code == "model.incompatible"
    assert proc.stdout == ""


@pytest.mark.parametrize("verb", ["infer", "run-pipeline"])
def test_a_head_that_cannot_read_the_outputs_is_one_line(tmp_path: Path, verb: str) -> None:
    # A yolo head on a 4-way classifier: the head's shape check raised ValueError, which
    # reached the user as a traceback.
    model = text_orientation_copy(tmp_path, ('task = "classification"', 'task = "detection"'))
    manifest = tmp_path / "model.toml"
    text = manifest.read_text()
    head = text.index("[head]")
    labels = 'labels = ["a", "b"]'
    manifest.write_text(text[:head] + f'[head]\ntype = "yolo"\noutput = "fetch_name_0"\n{labels}\n')
    proc = on_the_photo(verb, model, tmp_path)
    code = one_line_error(proc, "cannot read this model's outputs", "(1, 4)")
    assert code == "model.incompatible"


# Each was a pydantic, paho or overflow traceback, a silent v1 (--version 0), a wait of -1 s
# reported as no answer (cmd --timeout -1), or exit 0 with nothing done (watch --once -1).
AGENT_FLAGS: list[tuple[list[str], str]] = [
    (["models", "install", "m.onnx", "--version", "-3"], "--version"),
    (["models", "install", "m.onnx", "--version", "0"], "--version"),
    (["models", "activate", "text-orientation", "1", "--gate-timeout", "nan"], "--gate"),
    (["models", "activate", "text-orientation", "1", "--gate-timeout", "-5"], "--gate"),
    # A clock overflowed in the health gate: a traceback, and the version left installed.
    (["models", "install", "m.onnx", "--activate", "--gate-timeout", "1e300"], "at most"),
    (["models", "remove", "text-orientation", "0"], "version"),
    (["models", "pull", "foo", "--timeout", "-1"], "--timeout"),
    (["models", "pull", "foo", "--prefix", "a/#"], "wildcards"),
    # 30 GB a request: the engine's bad_alloc was blamed on the manifest.
    (["bench", "--model", "person-ssdlite", "--shape", "1,99999,99999,3"], "elements"),
]
FLEET_FLAGS: list[tuple[list[str], str]] = [
    (["cmd", "dev-1", "ping", "--timeout", "-1"], "--timeout"),
    (["watch", "--once", "-1"], "--once"),
    (["status", "--wait", "inf"], "--wait"),
    (["deploy", "m", "1", "--to", "d", "--timeout", "0"], "--timeout"),
    (["serve", "--window", "0"], "--window"),
    (["status", "--prefix", "edge/+"], "wildcards"),
    # `+` for "every box" was a paho traceback; `a/b` waited its whole timeout on a topic
    # no box reads; a type past 64 characters, with --no-check, a pydantic traceback.
    (["cmd", "+", "ping"], "is not a device id"),
    (["cmd", "a/b", "ping"], "is not a device id"),
    (["cmd", "fleet", "ping"], "names fleet-wide topics"),
    (["cmd", "dev-1", "x" * 65, "--no-check"], "1 to 64 characters"),
    (["deploy", "m", "1", "--to", "#"], "is not a device id"),
    (["deploy", "m", "1", "--group", "docks/+"], "is not a group name"),
    # isdigit() takes a superscript two, and int() of 5,000 digits raises: tracebacks.
    (["deploy", "m", "²", "--to", "d"], "version '²' is not a number"),
    (["deploy", "m", "1" * 5000, "--to", "d"], "is not a number >= 1"),
    # Taken in silence: tables every 2 s, forever, into a JSON reader.
    (["watch", "--json"], "needs --once"),
    (["publish-model", "m.onnx", "--version", "0", "--key", "k.pem"], "--version"),
    # timedelta overflowed; and -1 was called "seconds" on a flag in days.
    (
        ["publish-model", "m.onnx", "--version", "1", "--key", "k", "--expires-days", "1e300"],
        "days",
    ),
    (
        ["publish-model", "m.onnx", "--version", "1", "--key", "k", "--expires-days", "-1"],
        "days",
    ),
]


@pytest.mark.parametrize(
    ("prog", "args", "needle"),
    [("edge-agent", *case) for case in AGENT_FLAGS]
    + [("edge-fleet", *case) for case in FLEET_FLAGS],
)
def test_flag_values_are_checked_before_anything_runs(
    prog: str, args: list[str], needle: str
) -> None:
    proc = edge_agent_cli(*args) if prog == "edge-agent" else fleet(*args)
    assert one_line_error(proc, needle, prog=prog) == "input.invalid"


def test_edge_fleet_help_explains_every_option_and_shows_defaults() -> None:
    for verb, defaults in (
        (
            "publish-model",
            ["(default: edge/v1)", "(default: 128)", "(default: 30)", "else f32)"],
        ),
        ("serve", ["(default: edge-fleet)", "(default: 4)", "(default: random)"]),
    ):
        proc = fleet(verb, "--help")
        assert proc.returncode == 0, proc.stderr
        options = " ".join(proc.stdout.split("options:", 1)[1].split())
        for default in [
            *defaults,
            "(default: 127.0.0.1)",
            "(default: 1883, 8883 with TLS)",
            "(default: 5)",
        ]:
            assert default in options, (verb, default)
        # Every option is followed by words of help before the next option.
        for option in options.split(" --")[1:]:
            assert len(option.split()) >= 3, (verb, option)


def test_a_model_failing_the_health_gate_is_one_line_and_nothing_serves(
    tmp_path: Path, cache_dir: Path
) -> None:
    # The gate also logged model_health_failed, a second line before the CLI's own.
    # Signed and trusted, so no release_unverified warning stands beside it either.
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "model.onnx").write_bytes(np.random.default_rng(3).bytes(300_000))
    shutil.copy(MODELS / "text-orientation.toml", folder / "model.toml")
    assert fleet("keygen", str(tmp_path / "fleet.key")).returncode == 0
    places = ["--cache-dir", str(cache_dir), "--state-dir", str(tmp_path / "state")]
    keys = ["--key", str(tmp_path / "fleet.key"), "--trusted-key", str(tmp_path / "fleet.key.pub")]
    model = str(folder / "model.onnx")
    proc = edge_agent_cli(*places, "models", "install", model, "--activate", *keys)
    assert one_line_error(proc, "failed the health gate", "does not compile") == "health.failed"
    listed = edge_agent_cli(*places, "models", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    serving = [m for m in json.loads(listed.stdout) if m["name"] == "text-orientation"]
    assert [(m["source"], m["active"]) for m in serving] == [("reference", True)]
