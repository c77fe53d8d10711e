"""A crash at any step of an install or an activation leaves a complete model serving.

A child process deploys v2 over a serving v1 and dies with `os._exit` (no cleanup,
as a power cut or `kill -9`) at one named step. The "restart" is a fresh
`ModelStore` on the same folder: `current` must be v1 or v2, whole and verified,
the first inference on it must succeed, and the next deployment must go through
and sweep what the crash left.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from edge_agent.catalog.catalog import Catalog, ResolvedModel, default_models_dir
from edge_agent.fsio import FAULT_ENV, FAULT_EXIT
from edge_agent.heads.base import Classification
from edge_agent.infer import infer_frame
from edge_agent.paths import Layout
from edge_agent.runtime import create_backend
from edge_agent.runtime.base import RuntimeOptions
from edge_agent.store.release import generate_key, save_private_key
from edge_agent.store.store import FAULT_STEPS, ModelStore
from tests.conftest import REPO
from tests.integration.store_kit import ir_folder, onnx_folder, release_for

Resolve = Callable[[str], ResolvedModel]

CHILD = """
import sys
from pathlib import Path
from edge_agent.catalog.catalog import default_models_dir
from edge_agent.catalog.manifest import load_manifest
from edge_agent.paths import Layout
from edge_agent.store.release import load_private_key
from edge_agent.store.store import ModelStore
from tests.integration.store_kit import release_for

state, source, key_file = map(Path, sys.argv[1:4])
key = load_private_key(key_file)
manifest = load_manifest(default_models_dir() / "text-orientation.toml")
store = ModelStore(Layout(cache=state, state=state))
store.deploy(release_for("orient", 2, source, manifest, key), source, None,
             trusted_keys=[key.public_key()])
"""


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory, resolve: Resolve) -> Path:
    orientation = resolve("text-orientation")
    root = tmp_path_factory.mktemp("sources")
    onnx_folder(orientation, root / "onnx")
    ir_folder(orientation, root / "ir")  # v2: other bytes, two files
    return root


def _classify(store: ModelStore, frame: npt.NDArray[np.uint8], cache: Path) -> str:
    resolved = Catalog(default_models_dir(), cache, store=store).resolve("orient")
    assert resolved.path.is_relative_to(store.root)
    model = create_backend("openvino").compile(resolved.path, resolved.manifest, RuntimeOptions())
    with model:
        best = infer_frame(model, resolved.manifest, frame)[0]
    assert isinstance(best, Classification)
    return best.label


@pytest.mark.parametrize("step", FAULT_STEPS)
def test_crash_at_each_step_leaves_a_whole_verified_model_serving(
    step: str,
    tmp_path: Path,
    sources: Path,
    resolve: Resolve,
    astronaut: npt.NDArray[np.uint8],
) -> None:
    orientation = resolve("text-orientation")
    key = generate_key()
    save_private_key(key, tmp_path / "fleet.pem")
    state = tmp_path / "state"
    store = ModelStore(Layout(cache=state, state=state))
    v1 = release_for("orient", 1, sources / "onnx", orientation.manifest, key)
    store.deploy(v1, sources / "onnx", None, trusted_keys=[key.public_key()])

    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(state), str(sources / "ir"), str(tmp_path / "fleet.pem")],
        env={**os.environ, FAULT_ENV: step},
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert child.returncode == FAULT_EXIT, child.stderr  # it really died at that step

    restarted = ModelStore(Layout(cache=state, state=state))
    expected = 2 if FAULT_STEPS.index(step) >= FAULT_STEPS.index("activate.after_rename") else 1
    assert restarted.state("orient").current == expected
    assert restarted.verify() == []
    current = restarted.current("orient")
    assert current is not None
    assert current.path.name == ("model.xml" if expected == 2 else "model.onnx")
    assert _classify(restarted, astronaut, state) == "0"

    # The next update goes through and sweeps the crash's leftovers.
    v3 = release_for("orient", 3, sources / "ir", orientation.manifest, key)
    restarted.deploy(v3, sources / "ir", None, trusted_keys=[key.public_key()])
    assert restarted.state("orient").current == 3
    assert list((restarted.root / "tmp").iterdir()) == []
    assert sorted(p.name for p in (restarted.root / "models" / "orient").iterdir()) == [
        "state.json",
        "versions",
    ]
    assert all(b.stat().st_nlink > 1 for b in (restarted.root / "blobs").iterdir())
    assert restarted.verify() == []
