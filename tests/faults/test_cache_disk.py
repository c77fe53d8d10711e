"""A cache disk that refuses writes costs a conversion, never a compile.

The prepared IR is only a head start for the next compile. Saving it on a full cache disk
raised OpenVINO's `basic_ios::clear: iostream error` out of `compile`: every pipeline's
restore failed, and `edge-agent run` exited with a traceback. IRs are keyed on the OpenVINO
version, so an agent upgrade converts every model again at its first start: a box whose
cache disk was full at the upgrade restarted into the same error until systemd gave up.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from edge_agent.catalog.catalog import ResolvedModel
from edge_agent.heads.base import Detection
from edge_agent.infer import infer_frame
from edge_agent.runtime.base import CompiledModel, RuntimeOptions
from edge_agent.runtime.openvino_backend import OpenVinoBackend
from tests.conftest import CompileFn
from tests.disk_kit import files_capped_at

FACE = "face-blazeface"


def test_a_full_cache_disk_compiles_from_memory_and_says_so_once(
    compiled: CompileFn,
    tmp_path: Path,
    astronaut: npt.NDArray[np.uint8],
    caplog: pytest.LogCaptureFixture,
) -> None:
    reference, face = compiled(FACE)
    cache = tmp_path / "cache"
    options = RuntimeOptions(device="CPU", cache_dir=cache)
    caplog.set_level(logging.WARNING)
    with files_capped_at(4096):  # far below the IR's weights
        first = OpenVinoBackend().compile(face.path, face.manifest, options)
        second = OpenVinoBackend().compile(face.path, face.manifest, options)
    assert not list((cache / "ir").glob("*.xml")), "no IR could be written"
    # The model compiled from memory is the one the cache would have held.
    for model in (first, second):
        assert _faces(model, face, astronaut) == _faces(reference, face, astronaut)
        assert _faces(model, face, astronaut), "the astronaut's face is found"
    # Said once with its cause and the fix, though both compiles met the disk.
    said = [r for r in caplog.records if getattr(r, "event", None) == "ir_cache_unwritable"]
    assert len(said) == 1, [r.getMessage() for r in said]
    fields = said[0].fields  # type: ignore[attr-defined]
    assert "iostream error" in fields["error"] or "File too large" in fields["error"]
    assert "free space" in fields["fix"]
    # The disk has room again: the IR is written and used from then on.
    OpenVinoBackend().compile(face.path, face.manifest, options)
    assert list((cache / "ir").glob("*.xml"))


def _faces(
    model: CompiledModel, face: ResolvedModel, frame: npt.NDArray[np.uint8]
) -> list[tuple[float, ...]]:
    found = infer_frame(model, face.manifest, frame)
    return [tuple(round(v, 3) for v in r.box) for r in found if isinstance(r, Detection)]
