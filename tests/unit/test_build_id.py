"""The build id tells apart two builds of one version, and only when their code differs."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import edge_agent
from edge_agent import __version__
from edge_agent.build_id import build_id, source_digest
from edge_agent.cli.main import main


def package(root: Path) -> Path:
    (root / "pkg" / "sub").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("VERSION = '0.1.0'\n")
    (root / "pkg" / "sub" / "mod.py").write_text("def f() -> int:\n    return 1\n")
    return root / "pkg"


def test_one_changed_source_file_changes_the_build(tmp_path: Path) -> None:
    first = package(tmp_path / "a")
    second = package(tmp_path / "b")
    assert source_digest(first) == source_digest(second)
    (second / "sub" / "mod.py").write_text("def f() -> int:\n    return 2\n")
    assert source_digest(first) != source_digest(second)


def test_a_moved_file_changes_the_build(tmp_path: Path) -> None:
    first = package(tmp_path / "a")
    second = package(tmp_path / "b")
    shutil.move(second / "sub" / "mod.py", second / "mod.py")
    assert source_digest(first) != source_digest(second)


def test_bytecode_and_data_files_do_not_change_the_build(tmp_path: Path) -> None:
    # A wheel adds _data/, and any run adds __pycache__: a checkout of the same commit
    # must still say the same build.
    first = package(tmp_path / "a")
    second = package(tmp_path / "b")
    (second / "__pycache__").mkdir()
    (second / "__pycache__" / "__init__.cpython-311.pyc").write_bytes(b"\x00" * 16)
    (second / "_data").mkdir()
    (second / "_data" / "model.toml").write_text("name = 'x'\n")
    assert source_digest(first) == source_digest(second)


def test_version_prints_the_build_of_the_running_package(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    running = source_digest(Path(edge_agent.__file__).parent)
    assert build_id() == running
    assert capsys.readouterr().out == f"edge-agent {__version__} (build {running})\n"
