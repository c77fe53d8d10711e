"""What `edge-agent` prints, driven as a user drives it: one line per frame, data on
stdout and tables on stderr, device and precision fallbacks said out loud, help with
text and defaults, and a start-up that does not load an engine to print --help."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import cv2
import pytest

from edge_agent.catalog.catalog import ResolvedModel
from edge_agent.clips import compose
from tests.cli_kit import edge_agent_cli

FRAMES = 4


def edge_agent(*args: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, EDGE_AGENT_STATE_DIR=str(tmp / "state"))
    return edge_agent_cli(*args, env=env)


@pytest.fixture(scope="module")
def frames(
    tmp_path_factory: pytest.TempPathFactory, resolve: Callable[[str], ResolvedModel]
) -> Path:
    resolve("person-ssdlite")  # fetched before the subprocesses need it
    folder = tmp_path_factory.mktemp("frames")
    for i in range(FRAMES):
        cv2.imwrite(str(folder / f"{i:03d}.jpg"), compose(40 * i))
    return folder


def write_spec(path: Path, frames: Path, extra: str = "") -> Path:
    path.write_text(
        f'id = "dock"\n{extra}\n'
        '[model]\nname = "person-ssdlite"\n'
        f'[source]\ntype = "folder"\npath = "{frames}"\n'
    )
    return path


def json_lines(text: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@pytest.mark.parametrize(
    "sinks", ["", '[[sinks]]\ntype = "jsonl"\n'], ids=["default-sinks", "jsonl-stdout-sink"]
)
def test_json_prints_each_frame_once(frames: Path, tmp_path: Path, sinks: str) -> None:
    spec = tmp_path / "dock.toml"
    spec.write_text(write_spec(spec, frames).read_text() + sinks)
    proc = edge_agent("run-pipeline", str(spec), "--json", tmp=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = json_lines(proc.stdout)
    per_frame = [line for line in lines if "frame" in line]
    assert [line["frame"] for line in per_frame] == list(range(FRAMES))
    assert list(lines[-1]) == ["summary", "compile", "source"]


def test_data_on_stdout_tables_on_stderr(frames: Path, tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "dock.toml", frames)  # its default sink writes stdout
    proc = edge_agent("run-pipeline", str(spec), tmp=tmp_path)
    assert proc.returncode == 0, proc.stderr
    # Every stdout line is data; the summary table is on stderr only.
    assert len(json_lines(proc.stdout)) == FRAMES
    assert "dock summary:" in proc.stderr
    assert "end_to_end" in proc.stderr


def test_device_fallback_is_reported_on_stderr_and_in_the_summary(
    frames: Path, tmp_path: Path
) -> None:
    proc = edge_agent(
        "run-pipeline", "--model", "person-ssdlite", "--source", str(frames),
        "--device", "GPU", "--json", tmp=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    start = [ln for ln in proc.stderr.splitlines() if "runs on" in ln]
    assert len(start) == 1, proc.stderr  # said once, at the start
    assert "asked for GPU" in start[0]
    assert "GPU:" in start[0]
    report = json_lines(proc.stdout)[-1]["compile"]
    assert isinstance(report, dict)
    assert report["requested"] == "GPU"
    assert report["device"] == "CPU"
    assert report["fallbacks"][0]["device"] == "GPU"


def test_spec_priority_list_fallback_and_precision_are_reported(
    frames: Path, tmp_path: Path
) -> None:
    spec = tmp_path / "dock.toml"
    spec.write_text(
        f'id = "dock"\nsinks = []\n[model]\nname = "person-ssdlite"\ndevice = "GPU,CPU"\n'
        f'precision = "f16"\n[source]\ntype = "folder"\npath = "{frames}"\n'
    )
    proc = edge_agent("run-pipeline", str(spec), tmp=tmp_path)
    assert proc.returncode == 0, proc.stderr
    start = next(ln for ln in proc.stderr.splitlines() if "runs on" in ln)
    assert "asked for GPU,CPU" in start
    # The table says where it ran, and which precision, under the live/summary table.
    assert "openvino CPU" in proc.stderr
    summary = edge_agent("run-pipeline", str(spec), "--json", tmp=tmp_path)
    report = json_lines(summary.stdout)[-1]["compile"]
    assert isinstance(report, dict)
    assert report["precision_requested"] == "f16"
    if report["precision"] != "f16":  # a CPU without f16 arithmetic says why
        assert report["precision_note"]
        assert report["precision_note"] in start


def test_state_dir_holds_the_captures(frames: Path, tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "cap.toml", frames, 'sinks = [{type = "capture", seed = 1}]')
    state = tmp_path / "elsewhere"
    proc = edge_agent("--state-dir", str(state), "run-pipeline", str(spec), tmp=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert any((state / "captures" / "dock").rglob("*.jpg"))
    assert not (tmp_path / "state").exists()  # --state-dir wins over the environment


HEAVY = ("openvino", "nncf", "onnxruntime", "cv2", "rich", "numpy", "edge_agent.quantize")


def test_help_imports_no_engine(tmp_path: Path) -> None:
    """`edge-agent --help` and each command's --help load argparse-level modules only."""
    for args in (["--help"], *([c, "--help"] for c in ("infer", "bench", "run-pipeline",
                 "calibrate", "doctor", "models"))):  # fmt: skip
        proc = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "edge_agent", *args],
            capture_output=True, text=True, check=False, timeout=60,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        imported = {ln.split("|")[-1].strip() for ln in proc.stderr.splitlines() if "|" in ln}
        loaded = sorted(m for m in imported if m.split(".")[0] in HEAVY or m in HEAVY)
        assert not loaded, f"{args}: {loaded}"


def test_help_explains_every_option_and_shows_defaults(tmp_path: Path) -> None:
    bench = edge_agent("bench", "--help", tmp=tmp_path).stdout
    infer = edge_agent("infer", "--help", tmp=tmp_path).stdout
    pipeline = edge_agent("run-pipeline", "--help", tmp=tmp_path).stdout
    # The options part, on one line: the usage line above it names options without help.
    flat = {name: " ".join(text.split("options:", 1)[1].split()) for name, text in
            (("bench", bench), ("infer", infer), ("pipeline", pipeline))}  # fmt: skip
    for text in flat.values():
        for option in ("--device DEVICE", "--backend", "--hint", "--precision"):
            after = text.split(option, 1)[1].split(" --", 1)[0]
            assert len(after.split()) > 3, f"{option} has no help: {after!r}"
    # The defaults differ by command, and each help says its own.
    assert "(default: throughput)" in flat["bench"]
    assert "(default: latency)" in flat["infer"]
    assert "(default: 10.0)" in flat["bench"]
    assert "--max-frames MAX_FRAMES stop after" in flat["pipeline"]
