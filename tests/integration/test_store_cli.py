"""`edge-agent models install|activate|rollback|remove|verify|list` on a real store, and
`infer --model NAME` picking the store's current version before the reference model."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import cv2
import numpy as np
import numpy.typing as npt
import pytest

from edge_agent.catalog.catalog import ResolvedModel, default_models_dir
from edge_agent.cli.main import main
from edge_agent.store.release import generate_key, save_public_key
from tests.integration.store_kit import ir_folder, release_for

Resolve = Callable[[str], ResolvedModel]


@pytest.fixture
def model_file(tmp_path: Path, resolve: Resolve) -> Path:
    """`orient.onnx` with `orient.toml` beside it, as an operator would bring it."""
    folder = tmp_path / "incoming"
    folder.mkdir()
    shutil.copyfile(resolve("text-orientation").path, folder / "orient.onnx")
    manifest = (default_models_dir() / "text-orientation.toml").read_text()
    head, _, rest = manifest.partition("[source]")
    rest = rest[rest.index("[input]") :]
    (folder / "orient.toml").write_text(head.replace('"text-orientation"', '"orient"') + rest)
    return folder / "orient.onnx"


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_models_commands_end_to_end(
    tmp_path: Path,
    cache_dir: Path,
    model_file: Path,
    resolve: Resolve,
    astronaut: npt.NDArray[np.uint8],
    capsys: pytest.CaptureFixture[str],
) -> None:
    base = ["--cache-dir", str(cache_dir), "--state-dir", str(tmp_path / "state")]

    code, out, err = _run(capsys, *base, "models", "install", str(model_file), "--activate")
    assert code == 0, err
    assert "orient v1" in out
    assert "release_unverified" in err  # a local file has no signature: said so

    # A signed release of other bytes (IR), checked against the fleet key.
    key = generate_key()
    save_public_key(key.public_key(), tmp_path / "fleet.pub")
    save_public_key(generate_key().public_key(), tmp_path / "other.pub")
    folder = ir_folder(resolve("text-orientation"), tmp_path / "release")
    manifest = resolve("text-orientation").manifest
    (folder / "release.json").write_bytes(release_for("orient", 2, folder, manifest, key).to_json())
    release_args = ["models", "install", str(folder / "release.json"), "--activate"]
    code, _, err = _run(capsys, *base, *release_args, "--trusted-key", str(tmp_path / "other.pub"))
    assert code == 2
    assert err.count("\n") == 1
    assert "[release.signature]" in err
    code, out, err = _run(
        capsys, *base, *release_args, "--trusted-key", str(tmp_path / "fleet.pub")
    )
    assert code == 0, err

    code, out, _ = _run(capsys, *base, "models", "list", "--json")
    rows = json.loads(out)
    mine = {r["version"]: r for r in rows if r["source"] == "store"}
    assert mine[2]["active"] is True
    assert mine[1]["previous"] is True
    assert len(mine[2]["digest"]) == 64
    assert {r["name"] for r in rows if r["source"] == "reference"} >= {"text-orientation"}

    # Not a terminal: full columns, one line per model, nothing squeezed or cut.
    code, out, _ = _run(capsys, *base, "models", "list")
    lines = out.splitlines()
    assert lines[0].split()[:5] == ["source", "name", "version", "active", "digest"]
    current = next(line for line in lines if " 2 " in line and "orient " in line)
    assert "current" in current
    assert mine[2]["digest"][:12] in current
    assert "…" not in out

    # `infer --model orient` runs the store's current version.
    image = tmp_path / "page.png"
    cv2.imwrite(str(image), np.ascontiguousarray(np.rot90(astronaut, 2)))
    code, out, err = _run(capsys, *base, "infer", "--model", "orient", "--input", str(image))
    assert code == 0, err
    assert json.loads(out.splitlines()[0])["label"] == "180"

    assert _run(capsys, *base, "models", "rollback", "orient")[0] == 0
    code, _, err = _run(capsys, *base, "models", "remove", "orient", "1")
    assert code == 2
    assert "[input.invalid]" in err  # v1 is current again
    assert _run(capsys, *base, "models", "activate", "orient", "2")[0] == 0
    code, _, err = _run(capsys, *base, "models", "remove", "orient", "1")
    assert code == 2
    assert "[input.invalid]" in err  # v1 is previous now: the rollback target stays
    code, out, _ = _run(capsys, *base, "models", "verify")
    assert code == 0
    assert "ok: 2 version" in out

    weights = tmp_path / "state" / "store" / "models" / "orient" / "versions" / "2" / "model.bin"
    weights.chmod(0o644)
    with weights.open("r+b") as fh:
        fh.write(b"rot")
    code, _, err = _run(capsys, *base, "models", "verify")
    assert code == 1
    assert "model.bin" in err


def test_a_damaged_release_is_listed_as_such_beside_what_reads(
    tmp_path: Path, cache_dir: Path, model_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # One damaged release.json failed the whole listing with store.corrupt, and hid every
    # other model (the reference ones too) from the operator looking for what broke.
    base = ["--cache-dir", str(cache_dir), "--state-dir", str(tmp_path / "state")]
    assert _run(capsys, *base, "models", "install", str(model_file))[0] == 0
    assert _run(capsys, *base, "models", "install", str(model_file), "--name", "other")[0] == 0
    [release] = [p for p in (tmp_path / "state").rglob("release.json") if "orient" in p.parts]
    release.write_text("{ torn")
    code, out, err = _run(capsys, *base, "models", "list", "--json")
    assert code == 2
    rows = json.loads(out)
    damaged = {r["name"]: r["damaged"] for r in rows if r.get("damaged")}
    assert list(damaged) == ["orient v1"]
    assert damaged["orient v1"]
    assert {
        (r["name"], r["version"]) for r in rows if r["source"] == "store" and not r.get("damaged")
    } == {("other", 1)}
    assert {r["name"] for r in rows if r["source"] == "reference"} >= {"text-orientation"}
    assert err.count("\n") == 1
    assert err.startswith("edge-agent: error: orient v1: ")
    assert err.rstrip().endswith("[store.corrupt]")
    code, out, _ = _run(capsys, *base, "models", "list")
    assert code == 2
    assert any(
        line.startswith("store (damaged)") and "orient v1" in line for line in out.splitlines()
    )
