"""Swaps racing the other things a pipeline goes through: its run ending, other swaps.

Each race is made certain by holding one side at a seam (the record's write, the pool's
compile) until the other side has happened; the pool, the models, the MJPEG camera, the
store and the records are real.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from edge_agent.agent.pipelines import Pipelines
from edge_agent.protocol.agent import AgentEvent, DetectionEvent
from tests.agent_kit import photo_pipelines


def _until(done: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _on_camera(
    tmp_path: Path, cache_dir: Path, photo: npt.NDArray[np.uint8], camera: str
) -> tuple[Pipelines, dict[str, Any], list[AgentEvent | DetectionEvent]]:
    """Pipelines, and the spec of face-blazeface on a live camera: it runs until stopped."""
    events: list[AgentEvent | DetectionEvent] = []
    pipelines, spec = photo_pipelines(tmp_path, cache_dir, photo, events.append)
    return pipelines, {**spec, "source": {"type": "stream", "url": camera}}, events


def test_a_swap_whose_pipeline_ends_meanwhile_is_answered_not_a_crash(
    tmp_path: Path,
    cache_dir: Path,
    astronaut: npt.NDArray[np.uint8],
    camera: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # swap_model checked the pipeline's handle, recorded the new model, then used the
    # handle again: a run ending in between (a camera given up, a file played out) had
    # set it to None, and the command was answered `internal` (an AttributeError).
    pipelines, spec, _ = _on_camera(tmp_path, cache_dir, astronaut, camera)
    real_update = pipelines.records.update
    ended: list[bool] = []

    def update_as_the_run_ends(**changes: Any) -> Any:
        if not ended:
            ended.append(True)
            pipelines.handles()["cam"].stop()
            _until(lambda: pipelines.states()[0].status == "stopped", "the run's end")
        return real_update(**changes)

    try:
        pipelines.start(spec)
        monkeypatch.setattr(pipelines.records, "update", update_as_the_run_ends)
        state = pipelines.swap("cam", {"name": "text-orientation"})
        assert ended, "the seam was never reached"
        assert state.status == "stopped"
        # The swap that came too late gave its model back: nothing is left loaded.
        _until(lambda: not [t for t in threading.enumerate() if t.name == "swap-cam"], "swap")
        assert len(pipelines.pool) == 0
    finally:
        pipelines.close()
