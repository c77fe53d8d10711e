"""A box whose OpenVINO will not load (the case `doctor` calls unusable) still runs ONNX
Runtime pipelines, and an OpenVINO one fails with the CLI's one line, not a traceback."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import cv2
import pytest

from tests.cli_kit import edge_agent_cli, one_line_error
from tests.conftest import REPO, bgr, sample


@pytest.fixture
def broken_openvino(tmp_path: Path) -> dict[str, str]:
    """The environment of a process whose `import openvino` fails as a missing library does."""
    stub = tmp_path / "stub" / "openvino"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text(
        'raise ImportError("libopenvino.so.2610: cannot open shared object file: '
        'No such file or directory")\n'
    )
    return {**os.environ, "PYTHONPATH": f"{stub.parent}{os.pathsep}{REPO}"}


@pytest.fixture
def scans(tmp_path: Path) -> Path:
    folder = tmp_path / "scans"
    folder.mkdir()
    small = cv2.resize(bgr(sample("coffee")), (160, 120), interpolation=cv2.INTER_AREA)
    assert cv2.imwrite(str(folder / "page.png"), small)
    return folder


def _run_pipeline(
    backend: str, source: Path, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    return edge_agent_cli(
        "run-pipeline",
        "--model",
        "text-orientation",
        "--backend",
        backend,
        "--source",
        str(source),
        "--json",
        timeout=120,
        env=env,
    )


def test_an_onnxruntime_pipeline_runs_without_openvino(
    broken_openvino: dict[str, str], scans: Path
) -> None:
    done = _run_pipeline("onnxruntime", scans, broken_openvino)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    frame, summary = (json.loads(line) for line in done.stdout.splitlines())
    assert {r["label"] for r in frame["results"]} == {"0", "90", "180", "270"}
    assert summary["compile"]["backend"] == "onnxruntime"


def test_an_openvino_pipeline_says_its_engine_will_not_load(
    broken_openvino: dict[str, str], scans: Path
) -> None:
    done = _run_pipeline("openvino", scans, broken_openvino)
    code = one_line_error(done, "openvino engine cannot be loaded", "libopenvino.so", "onnxruntime")
    assert code == "install.incomplete"
