"""A camera that comes back and is lost again is retried from the shortest wait.

The agent retries a live pipeline whose source gave up with a wait that doubles, 5 s up
to 5 min. The doubling once never started again after the camera came back: a camera
that reboots now and then waited longer after each outage, and from about the seventh
on the agent waited the full 5 minutes before its first retry. Everything here is real:
an MJPEG camera over HTTP, the agent's pipeline manager, the pool and face-blazeface.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from edge_agent.protocol.agent import AgentEvent, DetectionEvent
from tests.agent_kit import photo_pipelines
from tests.integration.mjpeg_server import MjpegServer, free_port


def _retry_waits(caplog: pytest.LogCaptureFixture) -> list[float]:
    return [
        float(r.fields["delay_s"])  # type: ignore[attr-defined]
        for r in caplog.records
        if getattr(r, "event", None) == "pipeline_retry"
    ]


def _wait_for_retries(caplog: pytest.LogCaptureFixture, count: int) -> list[float]:
    # The failure's event goes out just before its retry is scheduled.
    deadline = time.monotonic() + 10
    while len(_retry_waits(caplog)) < count and time.monotonic() < deadline:
        time.sleep(0.02)
    return _retry_waits(caplog)


def test_a_camera_lost_again_after_it_came_back_is_retried_from_the_shortest_wait(
    tmp_path: Path,
    cache_dir: Path,
    astronaut: npt.NDArray[np.uint8],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="edge_agent.agent.pipelines")
    failed = threading.Semaphore(0)

    def on_event(event: AgentEvent | DetectionEvent) -> None:
        if event.kind == "pipeline_failed":
            failed.release()

    camera = MjpegServer(np.ascontiguousarray(astronaut[:, :, ::-1]), free_port(), fps=10)
    pipelines, _ = photo_pipelines(tmp_path, cache_dir, astronaut, on_event)
    spec = {
        "id": "door",
        "model": {"name": "face-blazeface"},
        "source": {
            "type": "stream",
            "url": camera.url,
            "give_up_after_s": 0.5,
            "stall_timeout_s": 0.5,
            "reconnect_min_s": 0.05,
            "reconnect_max_s": 0.1,
        },
    }
    try:
        # Down at the start: the run gives up, and the first retry waits the shortest time.
        pipelines.start(spec, persist=False)
        assert failed.acquire(timeout=30), "the pipeline never gave up on the absent camera"
        assert _wait_for_retries(caplog, 1) == [5.0]

        # Back before that retry: the relaunched pipeline runs and makes frames.
        camera.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            handle = pipelines.handles().get("door")
            if handle is not None and handle.telemetry.snapshot().frames > 0:
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"the camera's pipeline never ran again: {pipelines.states()}")

        # Lost again: the retry waits the shortest time again, not twice the last wait.
        camera.stop()
        assert failed.acquire(timeout=30), "the pipeline never gave up on the lost camera"
        assert _wait_for_retries(caplog, 2) == [5.0, 5.0]
    finally:
        pipelines.close()
        camera.stop()
