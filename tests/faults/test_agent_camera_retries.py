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
    caplog.set_level(logging.INFO, logger="edge_agent.agent")
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


def _stream(url: str, give_up_after_s: float) -> dict[str, object]:
    return {
        "id": "door",
        "model": {"name": "face-blazeface"},
        "source": {
            "type": "stream",
            "url": url,
            "give_up_after_s": give_up_after_s,
            "stall_timeout_s": 0.5,
            "reconnect_min_s": 0.05,
            "reconnect_max_s": 0.1,
        },
    }


def _logged(caplog: pytest.LogCaptureFixture, event: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "event", None) == event]


def _wait_logged(caplog: pytest.LogCaptureFixture, event: str) -> logging.LogRecord:
    deadline = time.monotonic() + 30
    while not _logged(caplog, event) and time.monotonic() < deadline:
        time.sleep(0.05)
    found = _logged(caplog, event)
    assert found, f"no {event} line was logged"
    return found[0]


def _fields(record: logging.LogRecord) -> dict[str, object]:
    return dict(record.fields)  # type: ignore[attr-defined]


def test_a_camera_back_after_a_retry_says_so_at_warning_with_how_long_it_was_down(
    tmp_path: Path,
    cache_dir: Path,
    astronaut: npt.NDArray[np.uint8],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # What an operator paged for a dark camera needs: the loss with its code, each retry
    # said to be one, the return in the journal (WARNING: the unit hides INFO), and which
    # pipeline the source's own lines are about.
    caplog.set_level(logging.INFO, logger="edge_agent")
    events: list[AgentEvent] = []
    failed = threading.Semaphore(0)

    def on_event(event: AgentEvent | DetectionEvent) -> None:
        if isinstance(event, AgentEvent):
            events.append(event)
            if event.kind == "pipeline_failed":
                failed.release()

    camera = MjpegServer(np.ascontiguousarray(astronaut[:, :, ::-1]), free_port(), fps=10)
    pipelines, _ = photo_pipelines(tmp_path, cache_dir, astronaut, on_event)
    try:
        pipelines.start(_stream(camera.url, 0.5), persist=False)
        assert failed.acquire(timeout=30), "the pipeline never gave up on the absent camera"
        lost = [e for e in events if e.kind == "source_lost"]
        assert lost, f"no source_lost event: {[e.kind for e in events]}"
        assert {e.code for e in lost} == {"source.unreachable"}
        for line in ("source_reconnecting", "source_failed"):
            assert _fields(_wait_logged(caplog, line))["pipeline"] == "door"

        camera.start()  # back before the first retry (5 s)
        recovered = _wait_logged(caplog, "source_recovered")
        assert recovered.levelno == logging.WARNING
        fields = _fields(recovered)
        assert fields["pipeline"] == "door"
        assert fields["code"] == "source.unreachable"
        # Down from the first loss to the first frame of the retry, across the two runs.
        assert 5.0 <= float(fields["down_s"]) < 30.0  # type: ignore[arg-type]

        started = [e.detail for e in events if e.kind == "pipeline_started"]
        assert started == [
            "model face-blazeface",
            "retry 1 after source.unreachable, model face-blazeface",
        ]
    finally:
        pipelines.close()
        camera.stop()


def test_a_stalled_camera_that_comes_back_within_its_run_is_lost_as_failed_and_recovered(
    tmp_path: Path,
    cache_dir: Path,
    astronaut: npt.NDArray[np.uint8],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="edge_agent")
    events: list[AgentEvent] = []
    camera = MjpegServer(np.ascontiguousarray(astronaut[:, :, ::-1]), free_port(), fps=10)
    camera.start()
    pipelines, _ = photo_pipelines(
        tmp_path,
        cache_dir,
        astronaut,
        lambda e: events.append(e) if isinstance(e, AgentEvent) else None,
    )
    try:
        pipelines.start(_stream(camera.url, 20.0), persist=False)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            handle = pipelines.handles().get("door")
            if handle is not None and handle.telemetry.snapshot().frames > 0:
                break
            time.sleep(0.1)
        assert not _logged(caplog, "source_recovered"), "recovered before it was ever lost"

        camera.stalled.set()
        deadline = time.monotonic() + 30
        while not [e for e in events if e.kind == "source_lost"] and time.monotonic() < deadline:
            time.sleep(0.05)
        lost = [e for e in events if e.kind == "source_lost"]
        # It sent frames, then none: failed, not unreachable.
        assert [e.code for e in lost] == ["source.failed"]
        camera.stalled.clear()

        fields = _fields(_wait_logged(caplog, "source_recovered"))
        assert fields["pipeline"] == "door"
        assert fields["code"] == "source.failed"
        assert 0.0 < float(fields["down_s"]) < 20.0  # type: ignore[arg-type]
        # Back within its give-up time: the run went on, nothing failed or restarted.
        assert [e.kind for e in events if e.kind.startswith("pipeline_")] == ["pipeline_started"]
    finally:
        pipelines.close()
        camera.stop()
