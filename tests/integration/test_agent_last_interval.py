"""A pipeline that ends between two telemetry ticks is still reported, once.

Telemetry is per interval. A file that plays out between two ticks (a short clip, a
fast model) used to vanish from telemetry: the tick after its end listed running
pipelines only, so its frames were never reported anywhere. Real pipeline, real model,
real photos; the ticks are called by hand so their timing is the test's, not a clock's.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import numpy.typing as npt

from edge_agent.protocol.agent import AgentEvent, DetectionEvent
from tests.agent_kit import photo_pipelines


def test_the_last_interval_of_an_ended_run_is_reported_once_and_in_order(
    tmp_path: Path, cache_dir: Path, astronaut: npt.NDArray[np.uint8]
) -> None:
    ended = threading.Event()

    def on_event(event: AgentEvent | DetectionEvent) -> None:
        if event.kind in ("pipeline_failed", "pipeline_stopped"):
            ended.set()

    pipelines, spec = photo_pipelines(tmp_path, cache_dir, astronaut, on_event)
    try:
        assert pipelines.interval_stats() == {}
        # Two whole runs of the same id, with no tick between them.
        for _ in range(2):
            ended.clear()
            pipelines.start(spec, persist=False)
            assert ended.wait(60), "the pipeline never ended"
            pipelines.stop("cam")
        first = pipelines.interval_stats()
        assert list(first) == ["cam"]
        assert first["cam"].frames == 3
        assert first["cam"].interval
        assert first["cam"].stages["infer"].count == 3
        second = pipelines.interval_stats()
        assert second["cam"].frames == 3  # the second run, not lost behind the first
        assert pipelines.interval_stats() == {}  # and each reported once only
    finally:
        pipelines.close()
