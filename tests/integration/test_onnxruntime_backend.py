"""The ONNX Runtime backend's own choices: threads, and what a file it cannot load says."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import onnxruntime as ort
import pytest

from edge_agent.catalog.catalog import ResolvedModel
from edge_agent.errors import EdgeAgentError
from edge_agent.runtime import create_backend
from edge_agent.runtime.base import RuntimeOptions
from tests.conftest import REPO
from tests.onnx_kit import image_manifest, onnx_model

Resolve = Callable[[str], ResolvedModel]

_THREADS = """
import json, os, sys
from pathlib import Path as P
from edge_agent.catalog.manifest import Manifest
from edge_agent.runtime import create_backend
from edge_agent.runtime.base import RuntimeOptions

os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
manifest = Manifest.model_validate_json(sys.argv[2])
found = {}
for hint in ("latency", "throughput"):
    model = create_backend("onnxruntime").compile(
        P(sys.argv[1]), manifest, RuntimeOptions(hint=hint)
    )
    options = model._session.get_session_options()
    found[hint] = [options.intra_op_num_threads, model.report.requests]
    model.close()
print(json.dumps(found))
"""


@pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to restrict the process to one"
)
def test_threads_follow_the_cpus_the_process_may_use(resolve: Resolve) -> None:
    resolved = resolve("text-orientation")
    done = subprocess.run(
        [sys.executable, "-c", _THREADS, str(resolved.path), resolved.manifest.model_dump_json()],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=True,
    )
    # Pinned to one CPU: one intra-op thread for the latency hint's single run, and one
    # single-threaded run at a time for the throughput hint (os.cpu_count() gave 2 each).
    assert json.loads(done.stdout) == {"latency": [1, 1], "throughput": [1, 1]}


def _compile(path: Path) -> None:
    create_backend("onnxruntime").compile(path, image_manifest(), RuntimeOptions())


def test_a_newer_opset_is_not_called_a_corrupt_file(tmp_path: Path) -> None:
    path = tmp_path / "opset99.onnx"
    path.write_bytes(onnx_model(opset=99))
    with pytest.raises(EdgeAgentError) as caught:
        _compile(path)
    err = caught.value
    assert err.code == "model.incompatible"
    assert f"ONNX Runtime {ort.__version__}" in err.problem
    assert "opset 99" in err.problem
    assert ".h:" not in err.problem
    assert "onnxruntime::" not in err.problem
    assert "newer ONNX Runtime" in err.fix
    assert "openvino" in err.fix
    assert "fetch it again" not in err.fix


def test_an_unknown_operator_is_not_called_a_corrupt_file(tmp_path: Path) -> None:
    path = tmp_path / "badop.onnx"
    path.write_bytes(onnx_model(op="NoSuchOp"))
    with pytest.raises(EdgeAgentError) as caught:
        _compile(path)
    assert caught.value.code == "model.incompatible"
    assert "no operator NoSuchOp" in caught.value.problem


def test_garbage_is_a_corrupt_file_and_says_why(tmp_path: Path) -> None:
    path = tmp_path / "garbage.onnx"
    path.write_bytes(b"\xffnot a model at all\x00" * 50)
    with pytest.raises(EdgeAgentError) as caught:
        _compile(path)
    err = caught.value
    assert err.code == "model.corrupt"
    assert err.problem == f"cannot read model {path}: Protobuf parsing failed."
    assert "fetch it again" in err.fix


@pytest.mark.parametrize("message", ["", "\n  \n"])
def test_an_empty_engine_message_still_makes_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, message: str
) -> None:
    # ORT's exceptions are built in C++: what one says is not ours to promise. An empty
    # one raised IndexError inside the handler, and the CLI printed a traceback.
    def refuse(*args: object, **kwargs: object) -> None:
        raise RuntimeError(message)

    monkeypatch.setattr(ort, "InferenceSession", refuse)
    path = tmp_path / "m.onnx"
    path.write_bytes(onnx_model())
    with pytest.raises(EdgeAgentError) as caught:
        _compile(path)
    assert caught.value.code == "model.corrupt"
    assert caught.value.problem == f"cannot read model {path}: RuntimeError"
