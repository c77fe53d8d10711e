"""The ONNX Runtime backend's own choices: threads, and what a file it cannot load says."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable

import pytest

from edge_agent.catalog.catalog import ResolvedModel
from tests.conftest import REPO

Resolve = Callable[[str], ResolvedModel]

_THREADS = """
import json, os, sys
from edge_agent.catalog.manifest import Manifest
from edge_agent.runtime import create_backend
from edge_agent.runtime.base import RuntimeOptions

os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
manifest = Manifest.model_validate_json(sys.argv[2])
found = {}
for hint in ("latency", "throughput"):
    model = create_backend("onnxruntime").compile(
        Path(sys.argv[1]), manifest, RuntimeOptions(hint=hint)
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
