"""Real models and signed releases for the store's tests.

- the text-orientation reference model as ONNX (one file), and converted to IR
  (two files, other bytes: a second version that shares no blob with the first);
- a tiny OpenVINO IR whose output is NaN on any input (sqrt of a negative), with
  a manifest that feeds it like text-orientation: it compiles, runs, and must
  still be refused by the health gate.
"""

from __future__ import annotations

import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import openvino as ov
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edge_agent.catalog.catalog import ResolvedModel
from edge_agent.catalog.manifest import Manifest
from edge_agent.store.release import Release, SignedRelease, build_release, sign


def onnx_folder(resolved: ResolvedModel, folder: Path) -> Path:
    """A copy of the reference ONNX file as `model.onnx`, in its own folder."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(resolved.path, folder / "model.onnx")
    return folder


def ir_folder(resolved: ResolvedModel, folder: Path) -> Path:
    """The reference model converted to IR: `model.xml` + `model.bin`."""
    folder.mkdir(parents=True, exist_ok=True)
    model = ov.Core().read_model(str(resolved.path))
    ov.save_model(model, str(folder / "model.xml"), compress_to_fp16=False)
    return folder


def nan_folder(folder: Path) -> Path:
    """An IR taking text-orientation's input whose 4 scores are all NaN."""
    folder.mkdir(parents=True, exist_ok=True)
    opset = ov.opset13
    x = opset.parameter([1, 3, 224, 224], ov.Type.f32, name="x")
    mean = opset.reduce_mean(x, np.array([2, 3], dtype=np.int64), keep_dims=False)
    four = opset.concat([mean, opset.slice(mean, [0], [1], [1], [1])], axis=1)  # [1, 4]
    negative = opset.subtract(opset.negative(opset.abs(four)), np.float32(1.0))
    scores = opset.sqrt(negative)
    scores.output(0).get_tensor().set_names({"fetch_name_0"})
    model = ov.Model([scores], [x], "nan-scores")
    ov.save_model(model, str(folder / "model.xml"), compress_to_fp16=False)
    return folder


def release_for(
    name: str,
    version: int,
    folder: Path,
    manifest: Manifest,
    key: Ed25519PrivateKey | None,
    *,
    now: datetime | None = None,
    lifetime: timedelta = timedelta(days=30),
    latency_budget_ms: float | None = None,
) -> SignedRelease:
    """A release of every model file in `folder` (model.onnx, or model.xml + model.bin)."""
    if (folder / "model.xml").is_file():
        files, model = ["model.xml", "model.bin"], "model.xml"
        manifest = manifest.model_copy(update={"format": "ir"})
    else:
        files, model = ["model.onnx"], "model.onnx"
    release = build_release(
        name=name,
        version=version,
        folder=folder,
        files=files,
        model=model,
        manifest=manifest,
        lifetime=lifetime,
        latency_budget_ms=latency_budget_ms,
        now=now or datetime.now(UTC),
    )
    return sign(release, key) if key is not None else SignedRelease(release=release)


def resign(release: Release, key: Ed25519PrivateKey, **changes: object) -> SignedRelease:
    """`release` with `changes` applied (unvalidated, as an attacker would), signed by `key`."""
    return sign(Release.model_construct(**{**dict(release), **changes}), key)
