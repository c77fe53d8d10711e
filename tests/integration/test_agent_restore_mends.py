"""What an earlier build recorded and ran, harmless but refused now, comes back mended.

Real agent pipeline manager, real models and photos; the record is written as an
earlier build wrote it, then restored.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from edge_agent.clips import write_walk
from edge_agent.errors import EdgeAgentError
from tests.agent_kit import photo_pipelines


def test_a_recorded_tiles_pipeline_on_a_classifier_comes_back_in_frame_mode(
    tmp_path: Path,
    cache_dir: Path,
    astronaut: npt.NDArray[np.uint8],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Earlier builds ran tiles and regions on any head, a classifier's included (one
    # unmerged result per tile); this one refuses that at the build, and such a pipeline
    # came back from the upgrade failed. A detector's keeps its mode.
    pipelines, spec = photo_pipelines(tmp_path, cache_dir, astronaut, lambda event: None)
    video = write_walk(tmp_path / "walk.avi", frames=30).path
    spec["source"] = {"type": "file", "path": str(video), "realtime": True, "loop": True}
    orient = {**spec, "id": "orient", "model": {"name": "text-orientation"}}
    orient["detect"] = {"mode": "tiles", "tile": 128}
    faces = {**spec, "id": "faces", "detect": {"mode": "regions"}}
    pipelines.records.update(pipelines={"orient": orient, "faces": faces})
    caplog.set_level(logging.WARNING, logger="edge_agent.agent")
    try:
        assert sorted(pipelines.restore()) == ["faces", "orient"]
        assert {s.id: s.status for s in pipelines.states()} == dict.fromkeys(
            ("orient", "faces"), "running"
        )
        handles = pipelines.handles()
        modes = {i: handles[i].spec.detect.mode for i in ("orient", "faces")}
        assert modes == {"orient": "frame", "faces": "regions"}
        mended = [
            vars(r)["fields"] for r in caplog.records if r.getMessage() == "pipeline_restore_mended"
        ]
        assert [m["pipeline"] for m in mended] == ["orient"]
        assert "classification head" in mended[0]["detail"]
        # The record keeps what was asked; a new start of it is still refused.
        recorded = pipelines.records.record.pipelines["orient"]
        assert recorded["detect"]["mode"] == "tiles"
        with pytest.raises(EdgeAgentError) as refused:
            pipelines.start({**orient, "id": "orient-2"}, persist=False)
        assert refused.value.code == "model.incompatible"
    finally:
        pipelines.close()
