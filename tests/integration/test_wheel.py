"""The wheel works away from the checkout: built, installed in a fresh venv, run from elsewhere.

`default_models_dir()` and the calibration recipes once resolved `parents[2]`, so a
`pip install .` found no models and no recipes. This builds the wheel from a copy of the
source (offline, no build isolation), installs it with no dependencies into a new venv
that borrows this venv's third-party packages, and runs the installed `edge-agent` from a
folder that is not the checkout.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Callable
from pathlib import Path

import cv2
import pytest

from edge_agent.catalog.catalog import ResolvedModel
from edge_agent.clips import sample
from tests.conftest import REPO

REFERENCE_MODELS = {p.stem for p in (REPO / "models").glob("*.toml")}
REFERENCE_RECIPES = {p.stem for p in (REPO / "calibration").glob("*.toml")}
# What the build needs from the checkout; nothing else (tests, tools) goes in.
SOURCES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "edge_agent", "models",
           "calibration")  # fmt: skip


def run(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{argv[:3]} exited {done.returncode}:\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("wheel")
    src = root / "src"
    src.mkdir()
    for name in SOURCES:
        if (REPO / name).is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "_data")
            shutil.copytree(REPO / name, src / name, ignore=ignore)
        else:
            shutil.copy2(REPO / name, src / name)
    dist = root / "dist"
    run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--no-index", "--wheel-dir", str(dist), str(src)],
        cwd=root,
    )  # fmt: skip
    [built] = dist.glob("edge_agent-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel: Path) -> Path:
    """A fresh venv with only the wheel installed; third-party packages come from ours."""
    root = wheel.parent.parent / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(root)], cwd=wheel.parent)
    python = root / "bin" / "python"
    run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
         "--no-deps", "--no-index", str(wheel)],
        cwd=wheel.parent,
    )  # fmt: skip
    ask = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(run([str(python), "-c", ask], cwd=root).strip())
    # A bare path line adds our site-packages after the venv's own, without running its
    # .pth files, so this checkout's editable install stays out of the new venv.
    (site / "borrowed.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return root


def test_wheel_carries_the_reference_files(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    models = {Path(n).stem for n in names if n.startswith("edge_agent/_data/models/")}
    recipes = {Path(n).stem for n in names if n.startswith("edge_agent/_data/calibration/")}
    assert models == REFERENCE_MODELS
    assert recipes == REFERENCE_RECIPES
    assert not [n for n in names if n.startswith(("tests/", "tools/"))]


def test_installed_wheel_lists_and_runs_reference_models(
    venv: Path, tmp_path: Path, resolve: Callable[[str], ResolvedModel], cache_dir: Path
) -> None:
    resolve("text-orientation")  # fetched into the shared cache, as a user's `models fetch`
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["EDGE_AGENT_CACHE"] = str(cache_dir)
    python, exe = str(venv / "bin" / "python"), str(venv / "bin" / "edge-agent")

    where = run(
        [python, "-c",
         "import edge_agent.catalog.catalog as c, edge_agent.quantize.data as k\n"
         "print(c.__file__); print(c.default_models_dir())\n"
         "print(k.reference_recipe('person-ssdlite'))"],
        cwd=tmp_path, env=env,
    ).splitlines()  # fmt: skip
    assert all(line.startswith(str(venv)) for line in where), where
    assert Path(where[2]).is_file()

    listed = run([exe, "models", "list"], cwd=tmp_path, env={**env, "COLUMNS": "200"})
    for name in REFERENCE_MODELS:
        assert name in listed

    page = tmp_path / "page.png"
    assert cv2.imwrite(str(page), sample("page"))
    out = run([exe, "infer", "--model", "text-orientation", "--input", str(page)], tmp_path, env)
    results = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert results
    assert results[0]["kind"] == "class"
