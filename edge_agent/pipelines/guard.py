"""The guard between a pipeline and its sinks: a failing sink is counted, never fatal.

Every path into a sink (frame results, events between frames, the end-of-stream
events, `close`) goes through a `GuardedSink`, so a sink that raises can neither
kill the thread that feeds the sinks nor starve the sinks after it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from edge_agent.logs import error_text, log_event
from edge_agent.pipelines.base import FrameResult, Sink

_log = logging.getLogger(__name__)


class GuardedSink:
    """A sink whose failures are counted and logged, never raised: the pipeline's only
    way to call a sink.

    A failing sink logs one line naming itself and the error, then at most one
    more per `LOG_EVERY_S` (with the running count), so a full disk at 30 frames
    a second cannot flood the journal.

    Args:
        sink: The sink to call.
        name: How log lines and counts name it, e.g. "jsonl:/var/log/dock.jsonl".
        pipeline: The pipeline's id, for the log lines.
        on_failure: Called once per failure (the pipeline's telemetry counts them).
        clock: Monotonic seconds; injectable so tests control the rate limit.
    """

    LOG_EVERY_S = 60.0

    def __init__(
        self,
        sink: Sink,
        name: str,
        pipeline: str,
        on_failure: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sink = sink
        self.name = name
        self.pipeline = pipeline
        self.failures = 0
        self._on_failure = on_failure
        self._clock = clock
        self._logged_at: float | None = None
        self._closed = False

    def emit(self, result: FrameResult) -> None:
        """Pass `result` on; count and log what the sink raises. Nothing after `close`."""
        if self._closed:
            return
        try:
            self.sink.emit(result)
        except Exception as exc:
            self._failed("emit", exc)

    def close(self) -> None:
        """Close the sink once; what it raises is counted, not raised."""
        if self._closed:
            return
        self._closed = True
        try:
            self.sink.close()
        except Exception as exc:
            self._failed("close", exc)

    def _failed(self, during: str, exc: Exception) -> None:
        self.failures += 1
        if self._on_failure is not None:
            self._on_failure()
        now = self._clock()
        if self._logged_at is None or now - self._logged_at >= self.LOG_EVERY_S:
            self._logged_at = now
            log_event(
                _log,
                logging.WARNING,
                "sink_failed",
                pipeline=self.pipeline,
                sink=self.name,
                during=during,
                error=error_text(exc),
                failures=self.failures,
            )


def guard_sinks(
    sinks: Sequence[Sink],
    pipeline: str,
    on_failure: Callable[[], None] | None = None,
    names: Sequence[str] | None = None,
) -> list[GuardedSink]:
    """Wrap every sink not yet guarded; `names[i]` names sink i (default: its type and index)."""
    guarded: list[GuardedSink] = []
    for i, sink in enumerate(sinks):
        if isinstance(sink, GuardedSink):
            guarded.append(sink)
        else:
            name = names[i] if names is not None else f"{type(sink).__name__}#{i}"
            guarded.append(GuardedSink(sink, name, pipeline, on_failure))
    return guarded
