"""Releases made on the spot for delivery tests that need no broker and no real model."""

from __future__ import annotations

import random
from pathlib import Path

from edge_agent.catalog.catalog import default_models_dir
from edge_agent.catalog.manifest import load_manifest
from edge_agent.store.release import SignedRelease, build_release, generate_key, sign

CHUNK = 64 * 1024


def make_release(tmp_path: Path, size: int, version: int = 1) -> tuple[SignedRelease, Path]:
    """A signed release `m` of one file of `size` random bytes, and the folder it is in."""
    folder = tmp_path / "src"
    folder.mkdir(exist_ok=True)
    (folder / "m.onnx").write_bytes(random.Random(size).randbytes(size))
    manifest = load_manifest(default_models_dir() / "text-orientation.toml")
    release = build_release(
        name="m",
        version=version,
        folder=folder,
        files=["m.onnx"],
        model="m.onnx",
        manifest=manifest,
        chunk_size=CHUNK,
    )
    return sign(release, generate_key()), folder
