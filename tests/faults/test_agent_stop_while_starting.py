"""stop_pipeline while start_pipeline still compiles: the stop wins, and nothing runs on.

The stop used to find the pipeline registered but with no handle yet, answer "stopped",
and let the start go on to run it and record it: a pipeline nobody could list or stop,
restored after every restart. The race is made certain by holding the start inside its
compile until the stop has answered; the pool, model, photos and records are real.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from edge_agent.agent import pipelines as agent_pipelines
from edge_agent.errors import EdgeAgentError
from edge_agent.pipelines.runner import PipelineHandle
from edge_agent.protocol.agent import AgentEvent, DetectionEvent
from tests.agent_kit import photo_pipelines


def test_a_stop_during_the_compile_cancels_the_start(
    tmp_path: Path,
    cache_dir: Path,
    astronaut: npt.NDArray[np.uint8],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    events: list[AgentEvent | DetectionEvent] = []
    pipelines, spec = photo_pipelines(tmp_path, cache_dir, astronaut, events.append)
    compiling, release = threading.Event(), threading.Event()
    real_handle = PipelineHandle

    def held(*args: Any, **kwargs: Any) -> Any:
        compiling.set()
        assert release.wait(30)
        return real_handle(*args, **kwargs)

    monkeypatch.setattr(agent_pipelines, "PipelineHandle", held)
    raised: list[BaseException] = []

    def start() -> None:
        try:
            pipelines.start(spec)
        except BaseException as exc:
            raised.append(exc)

    starter = threading.Thread(target=start)
    try:
        starter.start()
        assert compiling.wait(30)
        stopped = pipelines.stop("cam")
        assert stopped.status == "stopped"
        release.set()
        starter.join(60)
        assert not starter.is_alive()

        [error] = raised
        assert isinstance(error, EdgeAgentError), error
        assert error.code == "command.cancelled"
        assert pipelines.states() == []
        assert "cam" not in pipelines.records.record.pipelines
        assert not [t.name for t in threading.enumerate() if t.name.endswith("-cam")]
        assert not [e for e in events if e.kind == "pipeline_started"], events

        # The id is free: a new start runs and is recorded.
        monkeypatch.setattr(agent_pipelines, "PipelineHandle", real_handle)
        pipelines.start(spec)
        assert "cam" in pipelines.records.record.pipelines
        pipelines.stop("cam")
        assert "cam" not in pipelines.records.record.pipelines
    finally:
        release.set()
        pipelines.close()
